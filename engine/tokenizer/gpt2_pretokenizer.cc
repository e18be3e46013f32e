#include "engine/tokenizer/gpt2_pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace drt {
namespace {

// The ByteLevel regex, with \s spelled out as Unicode White_Space. Hugging
// Face runs it on Oniguruma, whose \s is exactly that set; PCRE2's UCP \s
// differs (it also matches U+180E, MONGOLIAN VOWEL SEPARATOR).
std::string Gpt2Pattern() {
  constexpr absl::string_view kWhitespace =
      R"(\x{09}-\x{0D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  return absl::StrCat(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^)", kWhitespace,
                      R"(\p{L}\p{N}]+|[)", kWhitespace, "]+(?![^", kWhitespace, "])|[",
                      kWhitespace, "]+");
}

// PCRE2_MATCH_INVALID_UTF lets invalid bytes simply fail to match instead of
// failing the whole call, and skips the per-call UTF validity scan of the
// entire subject (which would make splitting quadratic in the text length).
constexpr uint32_t kCompileOptions = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;

std::string Pcre2ErrorText(int error_code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(error_code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

void Gpt2PreTokenizer::CodeDeleter::operator()(pcre2_real_code_8* code) const {
  pcre2_code_free(code);
}

absl::StatusOr<Gpt2PreTokenizer> Gpt2PreTokenizer::Create() {
  const std::string pattern = Gpt2Pattern();
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   kCompileOptions, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return absl::InternalError(absl::StrCat("GPT-2 pre-tokenizer regex does not compile at offset ",
                                            error_offset, ": ", Pcre2ErrorText(error_code)));
  }
  // JIT is only a speed-up; without it PCRE2 interprets the same pattern.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return Gpt2PreTokenizer(code);
}

absl::Status Gpt2PreTokenizer::Split(std::string_view text,
                                     absl::FunctionRef<void(std::string_view)> on_piece) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr));
  if (match == nullptr) return absl::ResourceExhaustedError("cannot allocate PCRE2 match data");

  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t covered = 0;
  while (covered < text.size()) {
    const int rc = pcre2_match(code_.get(), subject, text.size(), covered, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::InternalError(
          absl::StrCat("GPT-2 pre-tokenizer regex failed: ", Pcre2ErrorText(rc)));
    }
    const PCRE2_SIZE* bounds = pcre2_get_ovector_pointer(match.get());
    const size_t start = bounds[0];
    const size_t end = bounds[1];
    if (start > covered) on_piece(text.substr(covered, start - covered));
    if (end == start) {  // cannot happen with this pattern; guards the loop
      covered = start;
      break;
    }
    on_piece(text.substr(start, end - start));
    covered = end;
  }
  if (covered < text.size()) on_piece(text.substr(covered));
  return absl::OkStatus();
}

}  // namespace drt
