#include "cli/command_line.h"

#include <cstdlib>
#include <iostream>

#include "absl/base/config.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

// Abseil releases before 20230802 exit 1 after --help. Their internal entry
// points are the only way to parse without that exit; later releases exit 0
// by themselves and take the public path.
#if defined(ABSL_LTS_RELEASE_VERSION) && ABSL_LTS_RELEASE_VERSION < 20230802
#define DRT_ABSL_HELP_EXITS_1 1
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#endif

#ifndef DRT_VERSION
#error "cli/CMakeLists.txt defines DRT_VERSION as the project version"
#endif

namespace drt::cli {

std::string VersionLine(const std::string& name) { return name + " " + DRT_VERSION; }

std::vector<char*> ParseCommandLine(const Program& program, int argc, char** argv) {
  absl::FlagsUsageConfig config;
  const std::vector<std::string> files = program.flag_files;
  auto listed = [files](absl::string_view filename) {
    for (const std::string& file : files) {
      if (absl::EndsWith(filename, file)) return true;
    }
    return false;
  };
  config.contains_help_flags = listed;
  config.contains_helpshort_flags = listed;
  config.version_string = [name = program.name] { return VersionLine(name) + "\n"; };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(program.usage);

#ifdef DRT_ABSL_HELP_EXITS_1
  namespace fi = absl::flags_internal;
  std::vector<char*> positional =
      fi::ParseCommandLineImpl(argc, argv, fi::ArgvListAction::kRemoveParsedArgs,
                               fi::UsageFlagsAction::kIgnoreUsage,
                               fi::OnUndefinedFlag::kAbortIfUndefined);
  // -1: no usage flag given; 1: help printed; 0: --version or
  // --only_check_args handled. All of these but -1 end the program well.
  const int usage = fi::HandleUsageFlags(std::cout, absl::ProgramUsageMessage());
  if (usage != -1) {
    std::cout.flush();
    std::exit(0);
  }
  return positional;
#else
  return absl::ParseCommandLine(argc, argv);
#endif
}

}  // namespace drt::cli
