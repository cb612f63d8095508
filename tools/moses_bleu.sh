#!/usr/bin/env bash
# The Perl pipelines that our BLEU functions reproduce, for checking them against a Moses checkout:
#   tools/moses_bleu.sh MOSES_DIR HYP REF [LANG]
# prints three scores:
#   tensor2tensor's get_ende_bleu.sh as written: the hypotheses go through
#     replace-unicode-punctuation.perl and tokenizer.perl, the reference through tokenizer.perl
#     alone; compounds split with ##AT## on both; multi-bleu.perl
#   multi-bleu.perl on tokenizer.perl output (no compound splitting)
#   multi-bleu.perl -lc on tokenizer.perl output
# Compare with: python -m annotated.cli.bleu --hyp HYP --ref REF
set -euo pipefail
moses=$1 hyp=$2 ref=$3 lang=${4:-de}
tok="$moses/scripts/tokenizer"
bleu="$moses/scripts/generic/multi-bleu.perl"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
read_file() { case "$1" in *.gz) gzip -dc "$1" ;; *) cat "$1" ;; esac; }
atat() { perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'; }
read_file "$hyp" | perl "$tok/replace-unicode-punctuation.perl" -l "$lang" \
    | perl "$tok/tokenizer.perl" -l "$lang" -q | atat > "$work/hyp.atat"
read_file "$ref" | perl "$tok/tokenizer.perl" -l "$lang" -q | atat > "$work/ref.atat"
for side in hyp ref; do
    read_file "${!side}" | perl "$tok/tokenizer.perl" -l "$lang" -q > "$work/$side.tok"
done
echo "paper-style (get_ende_bleu.sh): $(perl "$bleu" "$work/ref.atat" < "$work/hyp.atat")"
echo "multi-bleu.perl:                $(perl "$bleu" "$work/ref.tok" < "$work/hyp.tok")"
echo "multi-bleu.perl -lc:            $(perl "$bleu" -lc "$work/ref.tok" < "$work/hyp.tok")"
