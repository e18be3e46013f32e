// Where text that arrives in pieces can be cut so that its ids do not depend
// on what follows: the ids of text[0, cut) encoded now, followed by those of
// text[cut, end) plus any later text, equal the ids of the whole text
// (StreamingEncoder; docs/tokenizer.md, "Streamed text").
#pragma once

#include <cstddef>
#include <string_view>

#include "engine/tokenizer/added_token_splitter.h"

namespace drt {

// The largest safe cut of `text` for a GPT-2 style tokenizer that splits out
// `added_tokens` first and pre-tokenizes each plain stretch (with a leading
// space added to a stretch that lacks one when `add_prefix_space`); 0 when
// none is known yet. A cut is
//  - between two segments of the added-token split, or inside a plain
//    segment where a visible ASCII character is followed by ASCII whitespace
//    (a space only, with add_prefix_space): the GPT-2 pre-tokenizer always
//    splits there, and the rest starts as a segment would;
//  - before the first place where more text could change the split: a
//    possible start of an added token not complete yet, and an added token
//    ending the text (rstrip may take whitespace still to come, single_word
//    reads the next character);
//  - one where splitting the two sides apart gives the whole text's segments
//    (checked: it catches a single_word token judged by a neighbour across
//    the cut, and a rejected single_word match that hides a shorter token).
size_t FindStreamCut(std::string_view text, const AddedTokenSplitter& added_tokens,
                     bool add_prefix_space);

}  // namespace drt
