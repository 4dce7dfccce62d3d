#!/usr/bin/env bash
# Run real agent clients against a running rlgate gateway; starts no server itself.
#
#   scripts/try_clients.sh http://127.0.0.1:8000 rlg_agent_...
#
# Clients are installed with npm into CLIENTS_DIR (default /tmp/rlgate-clients) on first
# use. Each check prints PASS/FAIL; the exit status is the number of failures.
# CLAUDE_FULL=1 also runs Claude Code with its default system prompt and tools (about
# 30k prompt tokens: needs a policy with a long context).
set -uo pipefail

BASE_URL=${1:?usage: try_clients.sh BASE_URL AGENT_KEY}
KEY=${2:?usage: try_clients.sh BASE_URL AGENT_KEY}
BASE_URL=${BASE_URL%/}
BASE_URL=${BASE_URL%/v1}
CLIENTS_DIR=${CLIENTS_DIR:-/tmp/rlgate-clients}
PY=${PY:-$(dirname "$0")/../.venv/bin/python}
fails=0

pass() { echo "PASS  $*"; }
fail() { echo "FAIL  $*"; fails=$((fails + 1)); }

mkdir -p "$CLIENTS_DIR/home"
if [ ! -x "$CLIENTS_DIR/node_modules/.bin/claude" ]; then
  (cd "$CLIENTS_DIR" && npm install --no-audit --no-fund @anthropic-ai/claude-code >/dev/null 2>&1)
fi

# ---- Claude Code (Anthropic Messages, streaming) ---------------------------------------
claude_run() {
  HOME="$CLIENTS_DIR/home" ANTHROPIC_BASE_URL="$BASE_URL" ANTHROPIC_AUTH_TOKEN="$KEY" \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 \
    timeout 300 "$CLIENTS_DIR/node_modules/.bin/claude" -p "$@" --output-format json 2>&1 | tail -1
}
check_claude() {
  local name=$1 out
  shift
  out=$(claude_run "$@")
  if echo "$out" | grep -q '"is_error":false'; then
    pass "$name: $(echo "$out" | sed -E 's/.*"result":"([^"]{0,80}).*/\1/')"
  else
    fail "$name: ${out:0:300}"
  fi
}
if [ -x "$CLIENTS_DIR/node_modules/.bin/claude" ]; then
  echo "claude code $("$CLIENTS_DIR/node_modules/.bin/claude" --version 2>/dev/null)"
  check_claude "claude -p (bare, no tools)" "Say hello in three words." \
    --model claude-sonnet-4-6 --bare --system-prompt "You are a helpful assistant." --tools ""
  check_claude "claude -p (bare, continue session)" "And goodbye?" --continue \
    --model claude-sonnet-4-6 --bare --system-prompt "You are a helpful assistant." --tools ""
  if [ "${CLAUDE_FULL:-0}" = 1 ]; then
    check_claude "claude -p (default prompt and tools)" "What is 2 + 2?" --model claude-sonnet-4-6
  fi
else
  fail "claude code: npm install @anthropic-ai/claude-code failed"
fi

# ---- OpenClaw (needs Node >= 24.16; OPENCLAW=path/to/openclaw) ------------------------
OPENCLAW=${OPENCLAW:-$CLIENTS_DIR/node_modules/.bin/openclaw}
if [ -x "$OPENCLAW" ]; then
  oc_home="$CLIENTS_DIR/oc-home"
  mkdir -p "$oc_home/.openclaw"
  cat >"$oc_home/.openclaw/openclaw.json" <<EOF
{"models": {"providers": {"rlgate": {"baseUrl": "$BASE_URL/v1", "apiKey": "$KEY",
  "api": "openai-completions", "models": [{"id": "rlgate-policy", "name": "rlgate"}]}}},
 "agents": {"defaults": {"model": {"primary": "rlgate/rlgate-policy"}}}}
EOF
  if out=$(HOME="$oc_home" timeout 300 "$OPENCLAW" agent --local --message "Say hi." 2>&1); then
    pass "openclaw agent: ${out:0:120}"
  else
    fail "openclaw agent: ${out:0:300}"
  fi
else
  echo "SKIP  openclaw: not installed (npm install openclaw needs Node >= 24.16)"
fi

# ---- SDKs: Anthropic Messages and OpenAI Responses ----------------------------------
if out=$("$PY" - "$BASE_URL" "$KEY" 2>&1 <<'EOF'
import sys
import anthropic, openai
base, key = sys.argv[1], sys.argv[2]
a = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
m = a.messages.create(model="claude-sonnet-4-6", max_tokens=8,
                      messages=[{"role": "user", "content": "Say hi."}])
with a.messages.stream(model="claude-sonnet-4-6", max_tokens=8,
                       messages=[{"role": "user", "content": "Say hi."}]) as s:
    s.get_final_message()
o = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
r = o.responses.create(model="gpt-5", input="Say hi.", max_output_tokens=8)
r2 = o.responses.create(model="gpt-5", input="Again.", previous_response_id=r.id,
                        max_output_tokens=8)
events = list(o.responses.create(model="gpt-5", input="Say hi.", max_output_tokens=8,
                                 stream=True))
print(m.id, r.id, r2.id, events[-1].type)
EOF
); then
  pass "sdk (anthropic messages + openai responses): $out"
else
  fail "sdk: ${out:0:400}"
fi

exit $fails
