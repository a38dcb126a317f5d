#include "daemon/tokens_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>
#include <vector>

#include "common/file_util.h"
#include "common/secret.h"
#include "common/split.h"

namespace ft {

namespace {

constexpr uint64_t kMaxTokensFileBytes = uint64_t{16} << 20;

// What the map is keyed by: a keyed hash of the token, so a lookup compares no secret byte by byte.
std::string Digest(std::string_view token) { return HmacSha256Hex("ftd tokens file", token); }

bool IsTokenChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("._~+/=-").find(c) != std::string_view::npos;
}

// The user a line names, or why not (without the file:line prefix).
StatusOr<std::pair<std::string, Identity>> ParseLine(const std::string& line) {
  const std::vector<std::string> f = SplitOn(line, ',');
  if (f.size() != 4) {
    return Status::InvalidArgument("expected token,user,team,role (4 fields), found " +
                                   std::to_string(f.size()));
  }
  const std::string& token = f[0];
  if (token.size() < 16 || token.size() > 256 || !std::all_of(token.begin(), token.end(), IsTokenChar)) {
    return Status::InvalidArgument(
        "token: use 16 to 256 characters of letters, digits and ._~+/=- (e.g. openssl rand -hex 24)");
  }
  FT_RETURN_IF_ERROR(CheckIdentityName(f[1], "user"));
  FT_ASSIGN_OR_RETURN(const Role role, ParseRole(f[3]));
  if (!(role == Role::kAdmin && f[2].empty())) FT_RETURN_IF_ERROR(CheckIdentityName(f[2], "team"));
  return std::make_pair(
      token, Identity{.user = f[1], .team = f[2], .role = role, .every_team = role == Role::kAdmin});
}

// OK when only the file's owner may read it.
Status CheckPrivate(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Status::NotFound(path + ": cannot read the tokens file");
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(path + ": the tokens file is not a regular file");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status::InvalidArgument(path + ": the tokens file holds secrets but its mode " + mode +
                                   " lets its group or others read it: chmod 600 " + path);
  }
  return Status::OK();
}

}  // namespace

StatusOr<size_t> TokensFile::Load(const std::string& path) {
  FT_RETURN_IF_ERROR(CheckPrivate(path));
  FT_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path, kMaxTokensFileBytes));
  std::unordered_map<std::string, Identity> users;
  std::set<std::string> names;
  std::stringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    auto parsed = ParseLine(line);
    if (!parsed.ok()) return Status::InvalidArgument(where + parsed.status().message());
    auto& [token, who] = *parsed;
    if (!names.insert(who.user).second) {
      return Status::InvalidArgument(where + "user " + who.user + " appears twice: one line per user");
    }
    if (!users.emplace(Digest(token), who).second) {
      return Status::InvalidArgument(where + "this token is also another user's: give each user its own");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  by_digest_ = std::move(users);
  return by_digest_.size();
}

std::optional<Identity> TokensFile::Resolve(std::string_view token) const {
  if (token.empty()) return std::nullopt;
  const std::string digest = Digest(token);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_digest_.find(digest);
  if (it == by_digest_.end()) return std::nullopt;
  return it->second;
}

bool TokensFile::empty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_digest_.empty();
}

}  // namespace ft
