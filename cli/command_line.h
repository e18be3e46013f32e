// The command line of every drt binary: absl flags, plus --help and
// --version that print and exit 0.
//
// Why not absl::ParseCommandLine alone: Abseil 20220623 (Debian 12's) exits
// with status 1 after printing --help, so a user or an orchestrator that
// checks the exit code reads the help as a failure (newer Abseil releases
// exit 0). ParseCommandLine here parses the same way, then handles the usage
// flags itself.
#pragma once

#include <string>
#include <vector>

namespace drt::cli {

struct Program {
  std::string name;   // "drt-server": the first word of --version
  std::string usage;  // what the program does and an example, printed by --help
  // --help and --helpshort list the flags defined in source files whose path
  // ends with one of these ("server/server_flags.cc"); --helpfull lists all.
  std::vector<std::string> flag_files;
};

// "<name> <version>", the version being the CMake project's.
std::string VersionLine(const std::string& name);

// Parses argv with absl flags and returns the positional arguments (argv[0]
// first), as absl::ParseCommandLine does. --help, --helpshort, --helpfull,
// --helppackage, --helpon=, --helpmatch= print the flags to stdout and exit 0;
// --version prints VersionLine() and exits 0; an unknown flag or a bad value
// prints the error and exits 1.
std::vector<char*> ParseCommandLine(const Program& program, int argc, char** argv);

}  // namespace drt::cli
