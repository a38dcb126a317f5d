// Showing text that came from users or peers (job names, reasons, worker ids,
// event messages, ids in error messages) without letting it drive a terminal.
//
// EscapeControlChars keeps printable text (UTF-8 included) and writes every
// byte a terminal could act on as a visible escape: C0 controls and DEL as
// \xNN (ESC is \x1b, so "\x1b]0;pwned\x07" stays on screen as those
// characters), C1 controls (U+0080..U+009F) as \u00NN, and bytes that are not
// valid UTF-8 as \xNN. Everything else is left as it is (a backslash too, so
// ordinary names read the same). With max_bytes > 0 the input is cut there first and "..." appended.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ft {

std::string EscapeControlChars(std::string_view text, size_t max_bytes = 0);

}  // namespace ft
