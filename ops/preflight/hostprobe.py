"""Small Python programs the checklist runs *on the host* with the service venv's interpreter.

They use only the standard library (plus Pillow, which the host runtime has) and print one JSON object, so
a check reads a structured answer instead of parsing text. Requests go to the service from the host itself:
the service may bind loopback only.
"""

from __future__ import annotations

RUNTIME_VERSIONS = r"""
import importlib, importlib.metadata as md, json, platform, sys
out = {"python": platform.python_version(), "dists": {}}
for dist, module in (("openvino", "openvino"), ("openvino-genai", "openvino_genai"),
                     ("openvino-tokenizers", "openvino_tokenizers")):
    row = {}
    try:
        row["version"] = md.version(dist)
    except md.PackageNotFoundError:
        row["version"] = None
    try:
        importlib.import_module(module)
        row["import"] = "ok"
    except Exception as e:
        row["import"] = "%s: %s" % (type(e).__name__, e)
    out["dists"][dist] = row
print(json.dumps(out))
"""

# argv: url. Prints {"status": int|None, "body": ..., "error": str|None}
READYZ = r"""
import json, sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=15) as r:
        print(json.dumps({"status": r.status, "body": json.loads(r.read() or b"null"), "error": None}))
except urllib.error.HTTPError as e:
    body = e.read()
    try:
        body = json.loads(body)
    except ValueError:
        body = body.decode(errors="replace")[:300]
    print(json.dumps({"status": e.code, "body": body, "error": None}))
except Exception as e:
    print(json.dumps({"status": None, "body": None, "error": "%s: %s" % (type(e).__name__, e)}))
"""

# argv: host port model first_token_timeout total_timeout [api_keys_file]
# One small image + a short prompt, stream=true; measures first token and [DONE]; every wait bounded.
STREAM = r"""
import base64, http.client, io, json, sys, time
host, port, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
first_bound, total_bound = float(sys.argv[4]), float(sys.argv[5])
keys_file = sys.argv[6] if len(sys.argv) > 6 else ""
out = {"status": None, "chunks": 0, "chars": 0, "text": "", "done": False, "first_token_s": None,
       "total_s": None, "error": None}
try:
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 40, 40)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    body = {"model": model, "stream": True, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": "What colour is this image?"}]}]}
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if keys_file:
        keys = [l.strip() for l in open(keys_file) if l.strip() and not l.startswith("#")]
        if keys:
            headers["Authorization"] = "Bearer " + keys[0]
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=first_bound)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    resp = conn.getresponse()
    out["status"] = resp.status
    if resp.status != 200:
        out["error"] = resp.read(500).decode(errors="replace")
    else:
        for n, raw in enumerate(resp):
            if n > 10000 or time.monotonic() - t0 > total_bound:
                out["error"] = "no [DONE] within %.0f s" % total_bound
                break
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                out["done"] = True
                break
            event = json.loads(data)
            if "error" in event:
                out["error"] = json.dumps(event["error"])[:300]
                break
            delta = (event.get("choices") or [{}])[0].get("delta") or {}
            if "content" in delta:
                if out["first_token_s"] is None:
                    out["first_token_s"] = round(time.monotonic() - t0, 3)
                out["chunks"] += 1
                out["chars"] += len(delta["content"] or "")
                out["text"] = (out["text"] + (delta["content"] or ""))[:200]
    out["total_s"] = round(time.monotonic() - t0, 3)
except Exception as e:
    out["error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
"""

# One root shell run per host gathers every fact the shell-level checks read (a TCG VM pays seconds per
# process spawn over SSH; one round trip instead of thirty). argv: root service. Sections start with @@name@@.
SNAPSHOT = r"""
root=$1; svc=$2
sec() { echo "@@$1@@"; }
sec virt; systemd-detect-virt 2>/dev/null || true
sec container; if systemd-detect-virt --container >/dev/null 2>&1; then echo yes; else echo no; fi
sec flags; grep -m1 '^flags' /proc/cpuinfo
sec governors; grep -H . /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor 2>/dev/null
props=ActiveState,SubState,Result,UnitFileState,MainPID,Restart,RestartUSec,LimitNOFILE,DropInPaths,NRestarts
sec unit; systemctl show "$svc.service" -p "$props"
sec target; target=$(readlink -e "$root/current"); echo "$target"
sec python; if [ -n "$target" ] && [ -x "$target/venv/bin/python" ]; then echo "$target/venv/bin/python"; fi
sec env; if [ -n "$target" ]; then cat "$target/vlfleet.env" 2>/dev/null; fi
val() { [ -n "$target" ] && sed -n "s/^$1=//p" "$target/vlfleet.env" 2>/dev/null | tail -n1; }
model=$(val VLFLEET_MODEL_DIR); cache=$(val VLFLEET_MODEL_CACHE_DIR); port=$(val VLFLEET_PORT)
plan=$(val VLFLEET_CPU_PLAN_FILE); plan=${plan:-/run/vlfleet/cpu-plan.json}
sec manifest; if [ -n "$model" ]; then cat "$model/manifest.json" 2>/dev/null; fi
sec meminfo; cat /proc/meminfo
sec swaps; tail -n +2 /proc/swaps
sec df_tmp; df -B1 --output=target,fstype,avail /tmp /var/tmp | tail -n +2
cache=${cache:-/var/cache/vlfleet}
sec cache; echo "$cache"
sec df_models; df -B1 --output=target,fstype,avail "$root/models" 2>&1 | tail -n +2
sec df_cache; d=$cache; [ -d "$d" ] || d=$(dirname "$d"); df -B1 --output=target,fstype,avail "$d" 2>&1 | tail -n +2
pid=$(systemctl show -p MainPID --value "$svc.service"); pid=${pid:-0}
sec pid_limits; if [ "$pid" -gt 0 ]; then grep '^Max open files' "/proc/$pid/limits"; fi
sec pid_status; if [ "$pid" -gt 0 ]; then grep -E '^(VmRSS|Cpus_allowed_list):' "/proc/$pid/status"; fi
sec init_limits; grep '^Max open files' /proc/1/limits
sec plan; cat "$plan" 2>/dev/null
sec listen; if [ -n "$port" ]; then ss -Hltnp "sport = :$port"; fi
sec time; timedatectl show -p NTP -p NTPSynchronized 2>&1
sec journal
if [ "$(systemctl is-active "$svc.service")" != active ]; then journalctl -u "$svc.service" -n 5 --no-pager -o cat; fi
sec end
"""
