#include "bench/perplexity/output_file.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_format.h"

namespace drt::ppl {
namespace {

// The folder a file path lies in ("." for a bare name).
std::string FolderOf(const std::string& path) {
  const std::string folder = std::filesystem::path(path).parent_path().string();
  return folder.empty() ? "." : folder;
}

absl::Status Refused(std::string_view flag, const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrFormat("%s: cannot write '%s': %s", flag, path, why));
}

}  // namespace

absl::Status CheckWritable(std::string_view flag, const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) return Refused(flag, path, "not a regular file");
    if (::access(path.c_str(), W_OK) != 0) return Refused(flag, path, std::strerror(errno));
  } else if (errno != ENOENT) {
    return Refused(flag, path, std::strerror(errno));
  }
  // The file is replaced by a rename from its folder, so the folder must take
  // a new file either way.
  const std::string folder = FolderOf(path);
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    return Refused(flag, path, absl::StrFormat("folder '%s': %s", folder, std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status CheckNotSameFile(std::string_view output_flag, const std::string& output,
                              std::string_view input_flag, const std::string& input) {
  std::error_code ec;
  bool same = std::filesystem::equivalent(output, input, ec);  // both exist: same inode
  if (ec) {
    std::error_code ec_out, ec_in;
    const auto a = std::filesystem::weakly_canonical(output, ec_out);
    const auto b = std::filesystem::weakly_canonical(input, ec_in);
    same = !ec_out && !ec_in && a == b;
  }
  if (!same) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s '%s' is the %s file '%s': writing it would overwrite the input", output_flag, output,
      input_flag, input));
}

absl::Status CheckNotInFolder(std::string_view output_flag, const std::string& output,
                              std::string_view input_flag, const std::string& input) {
  std::error_code ec;
  if (!std::filesystem::is_directory(input, ec)) return absl::OkStatus();
  const auto folder = std::filesystem::weakly_canonical(input, ec);
  if (ec) return absl::OkStatus();
  // The output's folder after links and "..": inside `folder` when `folder`
  // is a prefix of it, component by component.
  auto at = std::filesystem::weakly_canonical(std::filesystem::absolute(output, ec), ec);
  if (ec) return absl::OkStatus();
  at = at.parent_path();
  const auto [mismatch, unused] = std::mismatch(folder.begin(), folder.end(), at.begin(), at.end());
  if (mismatch != folder.end()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s '%s' is inside the %s folder '%s', whose files are all read as input: write it "
      "elsewhere",
      output_flag, output, input_flag, input));
}

absl::Status CheckOutputFile(std::string_view flag, const std::string& path,
                             const std::vector<std::pair<std::string_view, std::string>>& inputs) {
  if (absl::Status s = CheckWritable(flag, path); !s.ok()) return s;
  for (const auto& [input_flag, input] : inputs) {
    if (input.empty()) continue;
    if (absl::Status s = CheckNotSameFile(flag, path, input_flag, input); !s.ok()) return s;
    if (absl::Status s = CheckNotInFolder(flag, path, input_flag, input); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status WriteFileReplacing(std::string_view flag, const std::string& path,
                                std::string_view contents) {
  const auto failed = [&](const std::string& why) {
    return absl::InternalError(absl::StrFormat("%s: cannot write '%s': %s", flag, path, why));
  };
  std::string name = path + ".XXXXXX";
  std::vector<char> buffer(name.begin(), name.end());
  buffer.push_back('\0');
  const int fd = ::mkstemp(buffer.data());
  if (fd < 0) return failed(std::strerror(errno));
  const std::string temp(buffer.data());
  // mkstemp makes the file 0600; results are for reading (0644, what a plain
  // create gives under the usual umask 022; reading the umask would change it).
  ::fchmod(fd, 0644);
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(temp.c_str());
      return failed(why);
    }
    written += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 || std::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(temp.c_str());
    return failed(why);
  }
  return absl::OkStatus();
}

}  // namespace drt::ppl
