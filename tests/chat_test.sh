#!/usr/bin/env bash
# `ember chat` used as a person would, in tmux: send-keys types, capture-pane reads the screen.
# A synth model (random weights: the text is noise, the behaviour is what is checked): a reply, a
# second prompt, /help, an unknown command, /system, multi-line input, /clear, a conversation
# longer than the context (turns dropped with a notice), Ctrl-D, Ctrl-C at the prompt; Ctrl-C in the
# middle of a long reply; the real model (when installed) answers a question.
# Skips (77) without tmux.
#   tests/chat_test.sh path/to/ember models-dir
set -uo pipefail
ember=$(realpath "$1") models=$2
command -v tmux >/dev/null || { echo "SKIP: tmux is not installed"; exit 77; }
tmp=$(mktemp -d)
sock="ember-chat-test-$$"
trap 'tmux -L "$sock" kill-server 2>/dev/null; rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
die() { echo "FAIL: $*"; exit 1; }
screen() { tmux -L "$sock" capture-pane -p -J -S -2000 -t chat; }
# Waits until the screen matches a pattern (extended regex) or 60 s pass.
wait_for() {
  for _ in $(seq 600); do
    tmux -L "$sock" has-session -t chat 2>/dev/null || die "the terminal closed while waiting for '$1'"
    screen | grep -qE "$1" && return 0
    sleep 0.1
  done
  fail "timed out waiting for '$1'; screen: $(screen | grep -v '^ *$' | tail -5)"
  return 1
}
count() { screen | grep -cE "$1"; }
type_line() { tmux -L "$sock" send-keys -t chat -l "$1"; tmux -L "$sock" send-keys -t chat Enter; }

"$ember" synth --preset tiny -o "$tmp/tiny.gguf" >/dev/null 2>&1 || { echo "FAIL: synth"; exit 1; }
n_start=0
start() {  # MODEL ARGS...: a fresh terminal (its own tmux server) running ember chat
  tmux -L "$sock" kill-server 2>/dev/null
  n_start=$((n_start + 1))
  sock="ember-chat-test-$$-$n_start"
  # The pane's shell ignores Ctrl-C (ember sets its own handler), so only ember sees it.
  tmux -L "$sock" new-session -d -s chat -x 200 -y 50 "bash -c 'trap \"\" INT; $ember chat -m $* -t 2; echo CHAT-EXITED-\$?; sleep 60'"
  wait_for "^>>> " || return 1
}

start "$tmp/tiny.gguf" -c 256 -n 24 --temp 0
type_line "hello there"
wait_for "^>>> .*hello there" && wait_for "(^|\n)>>> $"
[ "$(count '^>>> ')" -ge 2 ] || fail "no second prompt after the first reply"
type_line "/help"
wait_for "/system TEXT"
type_line "/nonsense"
wait_for "unknown command /nonsense"
type_line "/system be brief"
wait_for "system message set"
# Multi-line input: a continued line and a block.
type_line 'first line \'
wait_for '^\.\.\. '
type_line "second line"
type_line '"""'
type_line "block line"
type_line '"""'
sleep 1
type_line "/clear"
wait_for "conversation cleared"
# Longer than the context: turns are dropped with a notice, never a crash.
for i in $(seq 12); do type_line "message number $i with a few more words to fill the context faster"; sleep 0.6; done
wait_for "oldest turn was dropped"
tmux -L "$sock" send-keys -t chat C-d
wait_for "CHAT-EXITED-0"
# Ctrl-C at the prompt quits too.
start "$tmp/tiny.gguf" -c 256 -n 8
tmux -L "$sock" send-keys -t chat C-c
wait_for "CHAT-EXITED-0"

# Ctrl-C in the middle of a long reply (a SmolLM2-shaped synth model: random weights never end a
# reply on their own) stops it, and the conversation goes on.
"$ember" synth --preset smollm2-135m --type q4_0 -o "$tmp/s135.gguf" >/dev/null 2>&1 || die "synth smollm2-135m"
start "$tmp/s135.gguf" -c 4096 -n 3000 --temp 0
type_line "tell me everything"
sleep 0.7
tmux -L "$sock" send-keys -t chat C-c
wait_for "\[stopped\]"
before=$(count '^>>> ')
type_line "/help"
wait_for "/system TEXT"
for _ in $(seq 100); do [ "$(count '^>>> ')" -gt "$before" ] && break; sleep 0.1; done
[ "$(count '^>>> ')" -gt "$before" ] || fail "no prompt after Ctrl-C"
tmux -L "$sock" send-keys -t chat C-d
wait_for "CHAT-EXITED-0"

# A paste of 19,990 characters arrives whole (the terminal's canonical mode kept 4,095 of it and
# dropped the rest without a word): the chat counts as many tokens as for the same text piped in;
# and a pasted text with newlines is one message.
long=$(printf 'word %.0s' $(seq 3998))
piped=$(printf '%s\n' "$long" | "$ember" chat -m "$tmp/tiny.gguf" -c 256 -t 2 2>/dev/null | sed -nE 's/.*the message is too long: ([0-9]+) tokens.*/\1/p' | head -1)
[ -n "$piped" ] || fail "the piped long message got no 'too long' notice"
start "$tmp/tiny.gguf" -c 256 -n 8 --temp 0
printf '%s' "$long" >"$tmp/long.txt"
tmux -L "$sock" load-buffer "$tmp/long.txt"
tmux -L "$sock" paste-buffer -p -t chat
tmux -L "$sock" send-keys -t chat Enter
wait_for "the message is too long: [0-9]+ tokens"
pasted=$(screen | sed -nE 's/.*the message is too long: ([0-9]+) tokens.*/\1/p' | tail -1)
[ "$pasted" = "$piped" ] || fail "a pasted long line reached the model as $pasted tokens, piped as $piped"
before=$(count '^>>> ')
tmux -L "$sock" set-buffer -- "$(printf 'first pasted line\nsecond pasted line')"
tmux -L "$sock" paste-buffer -p -t chat
tmux -L "$sock" send-keys -t chat Enter
wait_for "second pasted line"
# One reply ends in one new prompt; two messages would get two replies and two prompts.
for _ in $(seq 600); do [ "$(count '^>>> ')" -gt "$before" ] && break; sleep 0.1; done
sleep 3
[ "$(count '^>>> ')" -eq $((before + 1)) ] || fail "a pasted two-line text was not one message: $(screen | tail -6)"
tmux -L "$sock" send-keys -t chat C-d
wait_for "CHAT-EXITED-0"

# The real model answers.
model="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$model" ]; then
  start "$model" -c 1024 -n 64 --seed 1
  type_line "What is the capital of France? Answer in one sentence."
  wait_for "Paris"
  tmux -L "$sock" send-keys -t chat C-d
  wait_for "CHAT-EXITED-0"
else
  echo "note: $model is not installed; the real-model turn was skipped"
fi
[ "$failures" -eq 0 ] && echo "chat: all checks passed"
exit $((failures > 0))
