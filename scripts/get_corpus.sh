#!/usr/bin/env bash
# Installs the English text corpus of the accuracy tools (`ember profile`, threshold calibration,
# `ember perplexity`) into data/corpus/ (git-ignored): The Jargon File 4.4.7 (Eric S. Raymond et
# al., public domain), 1.7 MB of English prose, from the Debian package jargon-text
# 4.4.7-4.1. The .deb is verified by SHA-256, and so is the text inside it; then the text is
# split deterministically, by paragraphs, into
#   data/corpus/calib.txt  the first 80 % of the bytes (calibration: profile, thresholds)
#   data/corpus/eval.txt   the last 20 % (held-out evaluation: perplexity, KL divergence)
# Nothing is downloaded again when both files are there and verified.
set -euo pipefail
cd "$(dirname "$0")/.."

deb_name=jargon-text
deb_version=4.4.7-4.1
deb_sha=17d05997e30eb3d5d6713929b8e2f81b63a5f50073858ad2a06701c71f54dcdb
member=./usr/share/doc/jargon-text/jargon.txt.gz
text_sha=40dfb4b98191a670a09a183d5798d50f243d23fdbd1495dcc0aca2ce5895ba97  # of the gunzipped jargon.txt
calib_sha=8cd7f8141a1689fd4279082efbb409749bc2da2ec9423d5b28e11570a7db0841
eval_sha=5f3e2ad15f5810ca852817c5862d7c52bf896e5574bd4c8704ecbf196587d59c

out=data/corpus
if [ -f "$out/calib.txt" ] && [ -f "$out/eval.txt" ] &&
   echo "$calib_sha  $out/calib.txt" | sha256sum -c --status &&
   echo "$eval_sha  $out/eval.txt" | sha256sum -c --status; then
  exit 0
fi
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "get_corpus: downloading $deb_name $deb_version" >&2
if ! (cd "$tmp" && apt-get download -qq "$deb_name=$deb_version" 2>/dev/null); then
  # apt's package lists may be missing on a fresh machine.
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  (cd "$tmp" && apt-get download -qq "$deb_name=$deb_version") ||
    { echo "get_corpus: cannot download $deb_name=$deb_version with apt-get" >&2; exit 1; }
fi
deb=$(ls "$tmp"/*.deb)
echo "$deb_sha  $deb" | sha256sum -c --status || { echo "get_corpus: $deb has the wrong SHA-256" >&2; exit 1; }
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" "$member"
gunzip -c "$tmp/$member" >"$tmp/jargon.txt"
echo "$text_sha  $tmp/jargon.txt" | sha256sum -c --status ||
  { echo "get_corpus: jargon.txt inside $deb has the wrong SHA-256" >&2; exit 1; }

# Paragraphs (blocks separated by blank lines), indentation and trailing blanks removed, lines
# of a paragraph kept; split at the first paragraph boundary past 80 % of the bytes.
python3 - "$tmp/jargon.txt" "$out/calib.txt.part" "$out/eval.txt.part" <<'PY'
import sys
src, calib, evalf = sys.argv[1:4]
text = open(src, encoding="utf-8").read()
paras = []
for block in text.split("\n\n"):
    lines = [l.strip() for l in block.split("\n")]
    lines = [l for l in lines if l]
    if lines:
        paras.append("\n".join(lines))
total = sum(len(p) + 2 for p in paras)
acc, cut = 0, len(paras)
for i, p in enumerate(paras):
    acc += len(p) + 2
    if acc >= 0.8 * total:
        cut = i + 1
        break
open(calib, "w", encoding="utf-8").write("\n\n".join(paras[:cut]) + "\n")
open(evalf, "w", encoding="utf-8").write("\n\n".join(paras[cut:]) + "\n")
PY
for f in calib eval; do
  want=$calib_sha
  [ $f = eval ] && want=$eval_sha
  echo "$want  $out/$f.txt.part" | sha256sum -c --status ||
    { echo "get_corpus: $out/$f.txt has the wrong SHA-256 after splitting" >&2; rm -f "$out/$f.txt.part"; exit 1; }
  mv "$out/$f.txt.part" "$out/$f.txt"
done
echo "get_corpus: $out/calib.txt ($(wc -c <"$out/calib.txt") bytes), $out/eval.txt ($(wc -c <"$out/eval.txt") bytes) verified" >&2
