#!/usr/bin/env bash
# Makes tests/data/sentencepiece_nfkc: a unigram SentencePiece model trained by Debian's
# spm_train (package `sentencepiece`) with its default nmt_nfkc normalization and byte
# fallback, and cases.txt: per case, the input as hex and the ids spm_encode gives for it
# (the reference the tokenizer test compares with).
set -euo pipefail
out=$(cd "$(dirname "$0")/.." && pwd)/tests/data/sentencepiece_nfkc
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
words="the quick brown fox jumps over lazy dog kiln compiles models into engines tuner routes fast cache token text file value ﬁne café naïve Ｆｕｌｌ ｗｉｄｔｈ ① ② ㍿ ℌ"
for i in $(seq 3000); do
  n=$((RANDOM % 10 + 3)) line=""
  for _ in $(seq $n); do set -- $words; shift $((RANDOM % $#)); line="$line $1"; done
  echo "${line# }"
done > "$work/corpus.txt"
spm_train --input="$work/corpus.txt" --model_prefix="$work/nfkc" --vocab_size=340 --model_type=unigram --byte_fallback=true \
  --character_coverage=1.0 --minloglevel=2 > /dev/null 2>&1
mkdir -p "$out"
cp "$work/nfkc.model" "$out/tokenizer.model"
# Cases: NFKC folds (full width, ligature, circled digits, squared words, letterlike symbols),
# tabs and ideographic spaces as whitespace, runs of spaces, leading and trailing spaces,
# characters outside the vocabulary (byte fallback) and a malformed byte.
printf '%s\n' "ＡＢＣ ﬁne café" "  two   spaces	here　ideo  " "①② ㍿ ℌello" "plain text" "naïve Ｆｕｌｌ ｗｉｄｔｈ kiln" \
  "ǅ ﬀ ½ x²" "zzz ★ 日本" "" "   " > "$work/cases.txt"
printf 'bad \xff byte\n' >> "$work/cases.txt"
: > "$out/cases.txt"
while IFS= read -r line; do
  printf '%s\n' "$(printf '%s' "$line" | od -An -tx1 | tr -d ' \n')" >> "$out/cases.txt"
  printf '%s\n' "$line" | spm_encode --model="$out/tokenizer.model" --output_format=id >> "$out/cases.txt"
done < "$work/cases.txt"
