#!/usr/bin/env bash
# Regenerate the README's pictures: a rendered page of the four-token worked
# solution and its heat map. Needs pdflatex, pdftoppm (poppler-utils) and
# the [plot] extra. Run from the repository root: bash docs/make_images.sh
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
symattn derive worked_examples/causal_4_tokens.yaml -o "$tmp/solution.pdf" --plot docs/weights.png
# the page with the softmax step
pdftotext -layout "$tmp/solution.pdf" "$tmp/solution.txt"
page=$(awk '/\f/{p++} /Step 7: Softmax/{print p+1; exit}' "$tmp/solution.txt")
pdftoppm -r 90 -f "$page" -l "$page" -png -singlefile "$tmp/solution.pdf" docs/solution-page
echo "wrote docs/solution-page.png (page $page) and docs/weights.png"
