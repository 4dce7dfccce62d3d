#!/usr/bin/env bash
# Run real agent clients against a running rlgate gateway; starts no server itself.
#
#   scripts/try_clients.sh http://127.0.0.1:8000 rlg_agent_... [rlg_admin_...]
#
# Clients are installed with npm under CLIENTS_DIR (default /tmp/rlgate-clients) on first
# use: Claude Code, OpenClaw (with Node 24 from the `node@24` npm package: it needs
# Node >= 24.16), Codex (its npm package carries a prebuilt binary). Each runs in its own
# scratch HOME / CODEX_HOME under CLIENTS_DIR, configured from docs/clients/, so nothing
# global is touched. Each check prints PASS/FAIL; the exit status is the number of
# failures. With an admin key as third argument (or RLGATE_ADMIN_KEY) a check passes
# only if the gateway also recorded at least one new interaction for it.
#
# CLIENTS selects the checks (default "claude openclaw codex sdk"; "sdk-tools" adds the
# forced-tool helpers of three SDKs: pydantic-ai's default structured output, the OpenAI
# Agents SDK with tool_choice="required", the Vercel AI SDK with toolChoice 'required',
# from scripts/try_clients/. SDK_PY is a python with pydantic-ai-slim[openai] and
# openai-agents installed (default: PY); the Vercel SDK is installed with npm under
# CLIENTS_DIR/vercel on first use).
# OPENCLAW_APIS: the OpenClaw provider APIs to try (default "openai-completions
#   anthropic-messages openai-responses").
# Claude Code also runs in its default mode (its own system prompt and tools, 21k-31k
# prompt tokens): with a short-context policy the check passes when the gateway answers
# with the context-length error that names both token counts. Its session-title request
# (structured output through output_config.format) is asked for with the SDK control
# protocol (`generate_session_title`) and passes when Claude Code gets a title.
# The packaged model is slow on CPU and does not always stop by itself: allow minutes.
set -uo pipefail

BASE_URL=${1:?usage: try_clients.sh BASE_URL AGENT_KEY [ADMIN_KEY]}
KEY=${2:?usage: try_clients.sh BASE_URL AGENT_KEY [ADMIN_KEY]}
ADMIN_KEY=${3:-${RLGATE_ADMIN_KEY:-}}
BASE_URL=${BASE_URL%/}
BASE_URL=${BASE_URL%/v1}
CLIENTS_DIR=${CLIENTS_DIR:-/tmp/rlgate-clients}
CLIENTS=${CLIENTS:-claude openclaw codex sdk}
OPENCLAW_APIS=${OPENCLAW_APIS:-openai-completions anthropic-messages openai-responses}
HERE=$(cd "$(dirname "$0")" && pwd)
TEMPLATES=$HERE/../docs/clients
PY=${PY:-$HERE/../.venv/bin/python}
fails=0

pass() { echo "PASS  $*"; }
# npm_install DIR PKG...: install into DIR (its own package.json, so npm never climbs to a
# parent folder); on failure the tail of npm's log is shown.
npm_install() {
  local dir=$1
  shift
  mkdir -p "$dir"
  [ -f "$dir/package.json" ] || echo '{"private": true}' >"$dir/package.json"
  if ! (cd "$dir" && npm install --no-audit --no-fund "$@" >"$dir/npm-install.log" 2>&1); then
    echo "npm install $* in $dir failed:" >&2
    tail -20 "$dir/npm-install.log" >&2
    return 1
  fi
}
fail() { echo "FAIL  $*"; fails=$((fails + 1)); }
want() { [[ " $CLIENTS " == *" $1 "* ]]; }

# Interactions recorded so far (needs the admin key; empty without one).
recorded() {
  [ -n "$ADMIN_KEY" ] || return 0
  "$PY" - "$BASE_URL" "$ADMIN_KEY" <<'EOF' 2>/dev/null
import sys, httpx
base, key = sys.argv[1], sys.argv[2]
total, page = 0, 1
while True:
    r = httpx.get(f"{base}/admin/api/sessions", params={"page": page, "page_size": 100},
                  headers={"Authorization": f"Bearer {key}"}, timeout=30)
    r.raise_for_status()
    items = r.json()["items"]
    total += sum(i["interactions"] for i in items)
    if len(items) < 100:
        break
    page += 1
print(total)
EOF
}
# check NAME OK OUTPUT [BEFORE]: PASS if OK is 0 (and, with an admin key, if something new
# was recorded since BEFORE).
check() {
  local name=$1 ok=$2 out=$3 before=${4:-} after
  after=$(recorded)
  if [ "$ok" != 0 ]; then
    fail "$name: ${out:0:400}"
  elif [ -n "$before" ] && [ -n "$after" ] && [ "$after" -le "$before" ]; then
    fail "$name: the client finished but the gateway recorded nothing new"
  else
    pass "$name: ${out:0:160}${after:+ (recorded interactions: $before -> $after)}"
  fi
}

# ---- Claude Code (Anthropic Messages, streaming) ---------------------------------------
claude_run() {
  HOME="$CLIENTS_DIR/home" ANTHROPIC_BASE_URL="$BASE_URL" ANTHROPIC_AUTH_TOKEN="$KEY" \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 \
    timeout 300 "$CLIENTS_DIR/node_modules/.bin/claude" -p "$@" --output-format json 2>&1 | tail -1
}
check_claude() {
  local name=$1 out before
  shift
  before=$(recorded)
  out=$(claude_run "$@")
  if echo "$out" | grep -q '"is_error":false'; then
    check "$name" 0 "$(echo "$out" | sed -E 's/.*"result":"([^"]{0,80}).*/\1/')" "$before"
  else
    check "$name" 1 "$out"
  fi
}
if want claude; then
  mkdir -p "$CLIENTS_DIR/home"
  if [ ! -x "$CLIENTS_DIR/node_modules/.bin/claude" ]; then
    npm_install "$CLIENTS_DIR" @anthropic-ai/claude-code
  fi
  if [ -x "$CLIENTS_DIR/node_modules/.bin/claude" ]; then
    echo "claude code $("$CLIENTS_DIR/node_modules/.bin/claude" --version 2>/dev/null)"
    check_claude "claude -p (bare, no tools)" "Say hello in three words." \
      --model claude-sonnet-4-6 --bare --system-prompt "You are a helpful assistant." --tools ""
    check_claude "claude -p (bare, continue session)" "And goodbye?" --continue \
      --model claude-sonnet-4-6 --bare --system-prompt "You are a helpful assistant." --tools ""
    # Session title (structured output: output_config.format with a JSON schema), asked
    # through the SDK control protocol on stdin; stdin stays open until the answer came.
    before=$(recorded)
    title_out=$CLIENTS_DIR/title.jsonl
    : >"$title_out"
    {
      printf '%s\n' '{"type":"control_request","request_id":"i0","request":{"subtype":"initialize"}}' \
        '{"type":"control_request","request_id":"t1","request":{"subtype":"generate_session_title","description":"Fix the failing unit test in the parser module","persist":false}}'
      for _ in $(seq 300); do
        grep -q '"request_id":"t1"' "$title_out" && break
        sleep 1
      done
    } | HOME="$CLIENTS_DIR/home" ANTHROPIC_BASE_URL="$BASE_URL" ANTHROPIC_AUTH_TOKEN="$KEY" \
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 \
      timeout 330 "$CLIENTS_DIR/node_modules/.bin/claude" -p --input-format stream-json \
      --output-format stream-json --verbose >"$title_out" 2>&1
    title=$(grep '"request_id":"t1"' "$title_out" | grep -oE '"title":"[^"]+"')
    if [ -n "$title" ]; then
      check "claude session title (output_config.format json_schema)" 0 "$title" "$before"
    else
      check "claude session title (output_config.format json_schema)" 1 "$(tail -c 400 "$title_out")"
    fi
    # Default mode, as its users run it (21k-31k prompt tokens with its tools): a
    # completed turn, or the gateway's context-length error naming both token counts.
    before=$(recorded)
    out=$(claude_run "What is 2 + 3?" --model claude-sonnet-4-6)
    if echo "$out" | grep -q '"is_error":false'; then
      check "claude -p (default prompt and tools)" 0 "completed" "$before"
    elif echo "$out" | grep -qE "prompt is [0-9]+ tokens but the model's context is [0-9]+ tokens"; then
      pass "claude -p (default prompt and tools): the context-length error names both counts: $(
        echo "$out" | grep -oE "prompt is [0-9]+ tokens but the model's context is [0-9]+ tokens")"
    else
      check "claude -p (default prompt and tools)" 1 "$out"
    fi
  else
    fail "claude code: npm install @anthropic-ai/claude-code failed"
  fi
fi

# ---- OpenClaw (needs Node >= 24.16) ------------------------------------------------------
# Installed next to Node 24 from npm (`node@24`; its preinstall script fetches the binary,
# which newer npm runs only when package.json allows it). Under Node 20, npm resolves
# `openclaw` to an empty 0.0.1 placeholder instead of failing.
OC_DIR=$CLIENTS_DIR/openclaw
OC_NODE_BIN=$OC_DIR/node_modules/node/bin
OPENCLAW=${OPENCLAW:-$OC_DIR/node_modules/.bin/openclaw}
# oc_config API FILE: docs/clients/openclaw.json for this gateway and provider API
oc_config() {
  local base=$BASE_URL/v1
  [ "$1" = anthropic-messages ] && base=$BASE_URL # the Anthropic SDK adds /v1 itself
  sed -e "s#__BASE_URL__/v1#$base#" -e "s#__AGENT_KEY__#$KEY#" \
    -e "s#\"api\": \"openai-completions\"#\"api\": \"$1\"#" "$TEMPLATES/openclaw.json" >"$2"
}
if want openclaw; then
  if [ ! -x "$OPENCLAW" ]; then
    mkdir -p "$OC_DIR"
    [ -f "$OC_DIR/package.json" ] || echo '{"allowScripts": {"node": true}}' >"$OC_DIR/package.json"
    npm_install "$OC_DIR" node@24 &&
      PATH="$OC_NODE_BIN:$PATH" npm_install "$OC_DIR" openclaw@latest
  fi
  if [ -x "$OPENCLAW" ] && PATH="$OC_NODE_BIN:$PATH" "$OPENCLAW" --version >/dev/null 2>&1; then
    echo "openclaw $(PATH="$OC_NODE_BIN:$PATH" "$OPENCLAW" --version 2>/dev/null | tail -1)," \
      "node $(PATH="$OC_NODE_BIN:$PATH" node --version)"
    for api in $OPENCLAW_APIS; do
      oc_home=$OC_DIR/home-$api
      rm -rf "$oc_home" # a fresh agent, session and workspace per run
      mkdir -p "$oc_home/.openclaw"
      oc_config "$api" "$oc_home/.openclaw/openclaw.json"
      for msg in "Say hi." "And goodbye?"; do # the second turn continues the session
        before=$(recorded)
        out=$(HOME="$oc_home" PATH="$OC_NODE_BIN:$PATH" timeout 900 \
          "$OPENCLAW" agent --local --message "$msg" 2>&1)
        rc=$?
        if [ $rc = 0 ] && echo "$out" | grep -q "LLM request failed"; then rc=1; fi
        reply=$(echo "$out" | grep -v '^\[\|^.\[3[0-9]m' | tr '\n' ' ')
        check "openclaw agent --local ($api): $msg" $rc "${reply:-$out}" "$before"
      done
    done
  else
    fail "openclaw: install failed (see npm install in $OC_DIR)"
  fi
fi

# ---- Codex (OpenAI Responses) ------------------------------------------------------------
CX_DIR=$CLIENTS_DIR/codex
CODEX=${CODEX:-$CX_DIR/node_modules/.bin/codex}
if want codex; then
  if [ ! -x "$CODEX" ]; then
    npm_install "$CX_DIR" @openai/codex
  fi
  if [ -x "$CODEX" ]; then
    echo "$("$CODEX" --version 2>/dev/null | tail -1)"
    cx_home=$CX_DIR/home
    rm -rf "$cx_home" "$CX_DIR/work"
    mkdir -p "$cx_home" "$CX_DIR/work"
    cp "$TEMPLATES/codex-instructions.md" "$cx_home/instructions.md"
    sed -e "s#__BASE_URL__#$BASE_URL#" -e "s#__INSTRUCTIONS_FILE__#$cx_home/instructions.md#" \
      "$TEMPLATES/codex-config.toml" >"$cx_home/config.toml"
    codex_run() {
      (cd "$CX_DIR/work" && CODEX_HOME="$cx_home" RLGATE_API_KEY="$KEY" timeout 900 \
        "$CODEX" exec --strict-config --skip-git-repo-check "$@" </dev/null 2>&1)
    }
    before=$(recorded)
    out=$(codex_run "Say hi.")
    rc=$?
    check "codex exec" $rc "$(echo "$out" | grep -v '^WARNING\|^warning' | tail -3 | tr '\n' ' ')" "$before"
    before=$(recorded)
    out=$(codex_run resume --last "And goodbye?")
    rc=$?
    check "codex exec resume --last" $rc \
      "$(echo "$out" | grep -v '^WARNING\|^warning' | tail -3 | tr '\n' ' ')" "$before"
  else
    fail "codex: npm install @openai/codex failed"
  fi
fi

# ---- SDKs: Anthropic Messages and OpenAI Responses ----------------------------------
if want sdk; then
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
fi

# ---- SDKs: their forced-tool helpers -----------------------------------------------------
if want sdk-tools; then
  SDK_PY=${SDK_PY:-$PY}
  for script in pydantic_ai_output.py agents_required.py; do
    before=$(recorded)
    out=$(timeout 600 "$SDK_PY" "$HERE/try_clients/$script" "$BASE_URL" "$KEY" 2>&1)
    check "sdk-tools $script" $? "$(echo "$out" | tail -3 | tr '\n' ' ')" "$before"
  done
  VC_DIR=$CLIENTS_DIR/vercel
  if [ -d "$VC_DIR/node_modules/ai" ] || npm_install "$VC_DIR" ai @ai-sdk/openai @ai-sdk/anthropic zod; then
    cp "$HERE/try_clients/vercel_required.mjs" "$VC_DIR/"
    before=$(recorded)
    out=$(cd "$VC_DIR" && timeout 600 node vercel_required.mjs "$BASE_URL" "$KEY" 2>&1)
    check "sdk-tools vercel_required.mjs" $? "$(echo "$out" | tail -3 | tr '\n' ' ')" "$before"
  else
    fail "sdk-tools: npm install ai failed"
  fi
fi

exit $fails
