#!/usr/bin/env bash
# Every C++ block (```cpp, ```c++ or ```cxx) of README.md and docs/*.md compiles, with warnings as
# errors. The dependencies' headers (xtensor, fmt, nlohmann-json) are Debian's, in /usr/include.
#   check-code-blocks.sh SOURCE_DIR OUT_DIR CXX [FLAGS...]
# A block that defines things of its own (a line starting "int main(", "namespace", "class",
# "struct" or "template") is compiled as a file. Any other is a fragment, as the docs show code:
# its #include and using lines go first, the rest becomes the body of a function.
set -euo pipefail
src=$1 out=$2 cxx=$3
shift 3
rm -rf "$out"
mkdir -p "$out"
for md in "$src/README.md" "$src"/docs/*.md; do
  name=$(basename "$md" .md)
  # Each block to OUT/NAME-LINE.block, LINE being where it starts in the page.
  awk -v prefix="$out/$name-" '
    /^[ \t]*```(cpp|c\+\+|cxx|C\+\+)[ \t]*$/ { file = prefix NR ".block"; inside = 1; next }
    /^[ \t]*```/ { inside = 0; next }
    inside { print > file }
  ' "$md"
done
status=0 count=0
for block in "$out"/*.block; do
  [ -e "$block" ] || continue
  cpp=${block%.block}.cpp
  if grep -qE '^(int main\(|namespace |class |struct |template)' "$block"; then
    cp "$block" "$cpp"
    extra=()
  else
    { grep -E '^(#include|using )' "$block" || true
      echo "void code_block() {"
      grep -vE '^(#include|using )' "$block" || true
      echo "}"; } > "$cpp"
    extra=(-Wno-unused-variable -Wno-unused-but-set-variable)
  fi
  count=$((count + 1))
  where=$(basename "$block" .block)
  if ! "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Werror "${extra[@]}" "$@" "$cpp" 2> "$cpp.log"; then
    echo "FAILED: the code block at ${where%-*}.md line ${where##*-} does not compile ($cpp):"
    head -30 "$cpp.log"
    status=1
  fi
done
[ "$count" -gt 0 ] || { echo "no code blocks found under $src"; exit 1; }
echo "$count code blocks checked"
exit $status
