#include "worker/report_journal.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <tuple>

#include "common/file_util.h"
#include "common/logging.h"

namespace ft::worker {

namespace fs = std::filesystem;

std::string FileSafe(const std::string& id) {
  std::string out = id;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  }
  return out.empty() ? "job" : out;
}

std::string AttemptFileStem(const std::string& job_id, int64_t epoch, int rank) {
  return FileSafe(job_id) + "-e" + std::to_string(epoch) + (rank > 0 ? "-r" + std::to_string(rank) : "");
}

std::string ReportJournal::Path(const std::string& job_id, int64_t epoch, int rank) const {
  return (fs::path(dir_) / (AttemptFileStem(job_id, epoch, rank) + ".exit")).string();
}

Status ReportJournal::Record(const ftune::v1::AttemptExited& e) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return Status::IOError(dir_ + ": cannot create the report journal: " + ec.message());
  fs::permissions(dir_, fs::perms::owner_all,
                  ec);  // entries hold attempt credentials: the worker's user only
  return ReplaceFileAtomically(Path(e.job_id(), e.epoch(), e.rank()), e.SerializeAsString());
}

std::vector<ftune::v1::AttemptExited> ReportJournal::Entries() const {
  std::vector<ftune::v1::AttemptExited> out;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir_, ec)) {
    if (f.path().extension() != ".exit") continue;
    auto bytes = ReadFileToString(f.path().string());
    ftune::v1::AttemptExited e;
    if (!bytes.ok() || !e.ParseFromString(*bytes)) {
      FT_LOG(WARN) << f.path().string() << ": unreadable journal entry skipped";
      continue;
    }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::make_tuple(a.job_id(), a.epoch(), a.rank()) <
           std::make_tuple(b.job_id(), b.epoch(), b.rank());
  });
  return out;
}

void ReportJournal::Forget(const std::string& job_id, int64_t epoch, int rank) {
  std::error_code ec;
  fs::remove(Path(job_id, epoch, rank), ec);
}

}  // namespace ft::worker
