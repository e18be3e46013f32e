#include "bench/load_average.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace drt::bench {

std::array<double, 3> ParseLoadAverage(std::string_view line) {
  std::array<double, 3> out = {NAN, NAN, NAN};
  size_t at = 0;
  for (double& value : out) {
    while (at < line.size() && line[at] == ' ') ++at;
    size_t end = at;
    while (end < line.size() && line[end] != ' ' && line[end] != '\n') ++end;
    if (end == at) break;
    const std::string field(line.substr(at, end - at));
    char* parsed_to = nullptr;
    const double v = std::strtod(field.c_str(), &parsed_to);
    if (parsed_to == field.c_str() + field.size()) value = v;
    at = end;
  }
  return out;
}

std::array<double, 3> LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string line;
  std::getline(in, line);
  return ParseLoadAverage(line);
}

std::string LoadAverageText() {
  const std::array<double, 3> load = LoadAverage();
  if (std::isnan(load[0]) || std::isnan(load[1]) || std::isnan(load[2])) return "unknown";
  char text[96];
  std::snprintf(text, sizeof(text), "%.2f %.2f %.2f", load[0], load[1], load[2]);
  return text;
}

}  // namespace drt::bench
