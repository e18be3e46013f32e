// drt-ppl's --json file: checked before the run without touching it, written
// after the run in one step, so a refusal or a failed run leaves an earlier
// file as it was (review-ppl P1: the check used to open it for writing, which
// truncated it, or truncated --text when both named the same file).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace drt::ppl {

// OK when `path` can be written later: an existing file must be a writable
// regular file, a missing one needs a writable folder. Creates and changes
// nothing. INVALID_ARGUMENT naming `flag` and the path otherwise.
absl::Status CheckWritable(std::string_view flag, const std::string& path);

// INVALID_ARGUMENT naming both flags when `output` names the file `input`
// names (the same file by path, after symbolic links and "..", or an existing
// hard link to it).
absl::Status CheckNotSameFile(std::string_view output_flag, const std::string& output,
                              std::string_view input_flag, const std::string& input);

// INVALID_ARGUMENT naming both flags when `input` is a directory and
// `output` would be created inside it, at any depth (drt-niah-text reads
// every file of a --text directory: a result written there would become
// filler of the next run). OK when `input` is not a directory.
absl::Status CheckNotInFolder(std::string_view output_flag, const std::string& output,
                              std::string_view input_flag, const std::string& input);

// A tool's output file (--json) against the files it reads: CheckWritable,
// then for each (flag, path) input CheckNotSameFile and CheckNotInFolder
// (a --model folder too: a result written over its config.json would break
// the model; review-toolsbranch 1). Inputs with an empty path are skipped.
absl::Status CheckOutputFile(std::string_view flag, const std::string& path,
                             const std::vector<std::pair<std::string_view, std::string>>& inputs);

// Writes `contents` to a new temporary file in `path`'s folder and renames it
// over `path`; on failure the temporary file is removed and `path` is as it
// was. INTERNAL naming `flag` and the path on failure.
absl::Status WriteFileReplacing(std::string_view flag, const std::string& path,
                                std::string_view contents);

}  // namespace drt::ppl
