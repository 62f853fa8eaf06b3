#!/usr/bin/env bash
# Cogency at both ends of its dependency ranges (pyproject.toml), each end in a virtualenv
# cached under ~/.cache/cogency-ci/versions (made again only when the ranges change), running
# a smoke subset of the tests against this checkout's sources:
#
#   lowest-core  the core dependencies at the lowest versions their ranges allow
#   lowest       the core and the extras openai, anthropic, gemini, postgres, serve and mcp at
#                the lowest versions that resolve together (uv's lowest-direct resolution: a
#                core dependency may sit above its own floor when an extra needs more)
#   newest       the same at the newest versions that resolve
#
#   scripts/check_versions.sh                 # every end
#   scripts/check_versions.sh lowest newest   # some
#
# Not covered: the local extra (xllamacpp: its lowest version is the one the whole suite runs
# with) and the fuzz extra (scripts/fuzz_service.py). The test tools the smoke subset needs
# (pytest, pytest-asyncio, hypothesis, httpx) are at their newest in every end.
set -euo pipefail
cd "$(dirname "$0")/.."

ends=("$@")
[ ${#ends[@]} -eq 0 ] && ends=(lowest-core lowest newest)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/cogency-ci/versions"
mkdir -p "$cache"
uv_version=0.13.9
uv="$cache/uv-$uv_version/bin/uv"
if [ ! -x "$uv" ]; then
    rm -rf "$cache/uv-$uv_version"
    python -m venv "$cache/uv-$uv_version"
    "$cache/uv-$uv_version/bin/pip" install -q --disable-pip-version-check "uv==$uv_version"
fi
# The indexes pip is set up with (a local mirror beside PyPI, say) are uv's too.
uv_index=(--index-strategy unsafe-best-match)
for url in $(pip config get global.extra-index-url 2>/dev/null || true); do
    uv_index+=(--extra-index-url "$url")
done
for dir in $(pip config get global.find-links 2>/dev/null || true); do
    uv_index+=(--find-links "$dir")
done

# The direct requirements of an end, one per line.
requirements() {
    python - "$1" <<'EOF'
import re, sys, tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
wanted = list(project["dependencies"])
if sys.argv[1] != "lowest-core":
    for extra in ("openai", "anthropic", "gemini", "postgres", "serve", "mcp"):
        wanted += extras[extra]
names = set()
for requirement in wanted:
    name = re.split(r"[<>=!~ \[]", requirement, 1)[0]
    if name not in names:
        names.add(name)
        print(requirement)
EOF
}

# Where each range matters, quickly: the core (Pydantic in @tool, tiktoken, regex) in process;
# each SDK against a local server speaking its wire format; the service; the MCP server once.
core_smoke=(tests/test_agent_loop.py tests/test_tools_decorator.py tests/test_tools_typed.py)
pg=tests/test_postgres_store.py
extras_smoke=(tests/test_llm_openai.py tests/test_llm_anthropic.py tests/test_llm_gemini.py
              "$pg::test_a_missing_database_says_to_create_it"
              "$pg::test_concurrent_first_opens_migrate_once"
              "$pg::test_a_task_is_held_by_one_store_until_released_or_closed"
              "$pg::test_a_connection_dropped_mid_save_is_rolled_back_and_retried"
              tests/test_service_app.py
              tests/test_mcp_server.py::test_an_agent_served_over_mcp_remembers_the_conversation)

for end in "${ends[@]}"; do
    case "$end" in
        lowest-core) resolution=lowest-direct; smoke=("${core_smoke[@]}") ;;
        lowest) resolution=lowest-direct; smoke=("${core_smoke[@]}" "${extras_smoke[@]}") ;;
        newest) resolution=highest; smoke=("${core_smoke[@]}" "${extras_smoke[@]}") ;;
        *) echo "unknown end $end: lowest-core, lowest or newest" >&2; exit 2 ;;
    esac
    wanted="$(requirements "$end")"
    key="$(printf '%s\n%s\n%s' "$(python -VV)" "$resolution" "$wanted" | sha256sum | cut -c1-16)"
    venv="$cache/$end-$key"
    if [ ! -x "$venv/bin/python" ]; then
        rm -rf "$venv" "$venv.partial"
        printf '%s\n' "$wanted" > "$cache/$end.in"
        "$uv" pip compile -q "$cache/$end.in" --resolution "$resolution" \
            --python "$(command -v python)" "${uv_index[@]}" -o "$cache/$end.txt"
        "$uv" venv -q --python "$(command -v python)" "$venv.partial"
        "$uv" pip install -q --python "$venv.partial/bin/python" "${uv_index[@]}" \
            -r "$cache/$end.txt" pytest pytest-asyncio hypothesis httpx
        mv "$venv.partial" "$venv"  # only a whole install is kept
    fi
    echo "== $end:" $("$uv" pip freeze --python "$venv/bin/python" 2>/dev/null |
        grep -iE '^(pydantic|tiktoken|regex|openai|anthropic|google-genai|asyncpg|fastapi|uvicorn|mcp)==')
    PYTHONPATH="$PWD/src:$PWD/tests" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        -x "${smoke[@]}"
done
