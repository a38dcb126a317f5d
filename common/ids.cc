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

}  // namespace ft
