// GPT-2's reversible byte <-> printable-character mapping ("bytes_to_unicode"):
// byte-level BPE vocabularies spell every byte as one visible character, e.g.
// the space byte as 'Ġ' (U+0120).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace drt {

// The vocabulary spelling of raw bytes (each byte becomes one character).
std::string ByteLevelEncode(std::string_view bytes);

// The raw bytes a vocabulary spelling stands for, or nullopt when `spelling`
// holds a character outside the 256-character alphabet (such tokens are not
// byte-level; Hugging Face then decodes their text as is).
std::optional<std::string> ByteLevelDecode(std::string_view spelling);

}  // namespace drt
