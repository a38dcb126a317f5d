#include "common/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace ft {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_EQ(s, Status::OK());
}

TEST(StatusTest, FactoriesCarryCodeAndMessage) {
  Status s = Status::NotFound("job 7");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.IsNotFound());
  EXPECT_FALSE(s.IsCorruption());
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(s.ToString(), "NotFound: job 7");
  EXPECT_TRUE(Status::Corruption("x").IsCorruption());
  EXPECT_TRUE(Status::IOError("x").IsIOError());
  EXPECT_TRUE(Status::InvalidArgument("x").IsInvalidArgument());
  EXPECT_EQ(Status::Aborted("epoch 3 < 4").ToString(), "Aborted: epoch 3 < 4");
}

TEST(StatusTest, WithContextPrefixesErrorsOnly) {
  EXPECT_EQ(Status::IOError("fsync failed").WithContext("checkpoints/step-1").ToString(),
            "IOError: checkpoints/step-1: fsync failed");
  EXPECT_TRUE(Status::OK().WithContext("ignored").ok());
}

Status FailsWhenNegative(int x) {
  if (x < 0) return Status::InvalidArgument("negative");
  return Status::OK();
}

Status Chain(int x, int* calls) {
  FT_RETURN_IF_ERROR(FailsWhenNegative(x));
  ++*calls;
  return Status::OK();
}

TEST(StatusTest, ReturnIfErrorStopsAtFirstFailure) {
  int calls = 0;
  EXPECT_TRUE(Chain(1, &calls).ok());
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(Chain(-1, &calls).IsInvalidArgument());
  EXPECT_EQ(calls, 1);
}

StatusOr<std::unique_ptr<int>> MakeInt(int x) {
  if (x == 0) return Status::InvalidArgument("zero");
  return std::make_unique<int>(x);
}

Status UseAssign(int x, int* out) {
  FT_ASSIGN_OR_RETURN(auto p, MakeInt(x));
  *out = *p;
  return Status::OK();
}

TEST(StatusOrTest, HoldsValueOrError) {
  auto good = MakeInt(5);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(**good, 5);
  auto bad = MakeInt(0);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().ToString(), "InvalidArgument: zero");
  int out = 0;
  EXPECT_TRUE(UseAssign(3, &out).ok());
  EXPECT_EQ(out, 3);
  EXPECT_TRUE(UseAssign(0, &out).IsInvalidArgument());
}

TEST(StatusOrTest, OkStatusWithoutValueBecomesInternal) {
  StatusOr<int> s(Status::OK());
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Status::Code::kInternal);
}

TEST(StatusOrDeathTest, ValueOfErrorAborts) {
  StatusOr<int> s(Status::NotFound("nope"));
  EXPECT_DEATH((void)s.value(), "NotFound: nope");
}

TEST(CheckDeathTest, BrokenInvariantNamesFileAndLine) {
  EXPECT_DEATH(FT_CHECK(1 + 1 == 3), "status_test.cc:[0-9]+: check failed: 1 \\+ 1 == 3");
}

}  // namespace
}  // namespace ft
