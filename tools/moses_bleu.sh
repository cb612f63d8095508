#!/usr/bin/env bash
# The Perl pipelines that our BLEU functions reproduce, for checking them against a Moses checkout:
#   tools/moses_bleu.sh MOSES_DIR HYP REF [LANG]
# prints tensor2tensor's get_ende_bleu.sh score (Unicode punctuation replaced, tokenizer.perl,
# compounds split with ##AT##, multi-bleu.perl) and `multi-bleu.perl -lc` on tokenizer.perl output.
# Compare with: python -m annotated.decoding --hyp HYP --ref REF
set -euo pipefail
moses=$1 hyp=$2 ref=$3 lang=${4:-de}
tok="$moses/scripts/tokenizer"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for side in hyp ref; do
    file=${!side}
    case "$file" in *.gz) reader=(gzip -dc "$file") ;; *) reader=(cat "$file") ;; esac
    "${reader[@]}" | perl "$tok/replace-unicode-punctuation.perl" -l "$lang" | perl "$tok/tokenizer.perl" -l "$lang" -q \
        | perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' > "$work/$side.atat"
    "${reader[@]}" | perl "$tok/tokenizer.perl" -l "$lang" -q > "$work/$side.tok"
done
echo "paper-style (get_ende_bleu.sh): $(perl "$moses/scripts/generic/multi-bleu.perl" "$work/ref.atat" < "$work/hyp.atat")"
echo "multi-bleu.perl -lc:            $(perl "$moses/scripts/generic/multi-bleu.perl" -lc "$work/ref.tok" < "$work/hyp.tok")"
