#include "common/ids.h"

#include <algorithm>

#include "common/untrusted_text.h"

namespace ft {

bool IsValidJobId(std::string_view id) {
  return id.size() > 2 && id.size() <= kMaxJobIdLength && id.substr(0, 2) == "j-" &&
         std::all_of(id.begin() + 2, id.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Status CheckJobId(std::string_view id, std::string_view field) {
  if (IsValidJobId(id)) return Status::OK();
  return Status::InvalidArgument(std::string(field) + " '" + EscapeControlChars(id, 64) +
                                 "' is not a job id: job ids look like j-000001 (ftctl ls or GET /api/jobs "
                                 "lists them)");
}

Status CheckPoolName(std::string_view pool, std::string_view field) {
  const bool ok =
      !pool.empty() && pool.size() <= kMaxPoolNameLength && std::all_of(pool.begin(), pool.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
               c == '_' || c == '-';
      });
  if (ok) return Status::OK();
  return Status::InvalidArgument(std::string(field) + " '" + EscapeControlChars(pool, 64) +
                                 "' is not a pool name: use 1 to 64 letters, digits, '.', '_' or '-' (e.g. "
                                 "a100-spot)");
}

}  // namespace ft
