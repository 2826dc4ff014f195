// vlfleet web UI: pick or drop an image, ask, watch tokens stream in (SSE over fetch), ask follow-ups.
"use strict";
const $ = (id) => document.getElementById(id);
let image = null;      // the File being discussed
let session = null;    // server's key for the conversation so far (a follow-up sends only its question)
let affinity = null;   // the fleet's load balancer names the conversation's host by this key: sent back, it stays there

function setImage(file) {
  if (!file || !file.type.startsWith("image/")) { showError("That file is not an image."); return; }
  image = file; session = null; affinity = null;
  $("preview").src = URL.createObjectURL(file); $("preview").hidden = false;
  $("drop-hint").hidden = true; $("log").innerHTML = ""; $("stats").textContent = ""; showError(null);
  $("question").focus();
}

function showError(message) { $("error").textContent = message || ""; $("error").hidden = !message; }

// The "JSON" toggle: the answer is constrained to the schema (any JSON object when the schema is left empty).
function responseFormat() {
  if (!$("json").checked) return null;
  const text = $("schema").value.trim();
  if (!text) return { type: "json_object" };
  let schema;
  try { schema = JSON.parse(text); } catch (err) { throw new Error(`The schema is not valid JSON: ${err.message}`); }
  return { type: "json_schema", json_schema: { name: "answer", schema, strict: true } };
}

// A finished JSON answer: shown parsed and pretty-printed, the raw text folded away below it.
function showParsed(answer, text) {
  const raw = document.createElement("details"); raw.className = "raw";
  raw.innerHTML = "<summary>raw answer</summary>";
  raw.appendChild(answer.querySelector(".text"));
  let view;
  try {
    view = document.createElement("pre"); view.className = "json";
    view.textContent = JSON.stringify(JSON.parse(text), null, 2);
  } catch (err) {
    view = document.createElement("p"); view.className = "json-error";
    view.textContent = `The answer is not valid JSON (${err.message}).`; raw.open = true;
  }
  answer.append(view, raw);
}

function addEntry(role, text) {
  const li = document.createElement("li");
  li.className = role; li.textContent = text;
  $("log").appendChild(li);
  return li;
}

// Minimal SSE parser for a fetch() body: yields {event, data} objects.
async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
      let event = "message", data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      if (data.length) yield { event, data: JSON.parse(data.join("\n")) };
    }
  }
}

async function ask(question) {
  let format;
  try { format = responseFormat(); } catch (err) { showError(err.message); return; }
  const form = new FormData();
  form.append("question", question);
  form.append("detail", $("detail").value);
  if (session) form.append("session", session);
  if (format) form.append("response_format", JSON.stringify(format));
  form.append("image", image);  // sent again so an expired session still has its image
  addEntry("user", question);
  const answer = addEntry("assistant", "");
  const status = document.createElement("span"); status.className = "status"; status.textContent = "waiting…";
  const text = document.createElement("span"); text.className = "text";
  answer.append(status, text);
  $("send").disabled = true; showError(null);
  const t0 = performance.now();
  let firstToken = null, tokens = 0;
  try {
    const response = await fetch("/chat", { method: "POST", body: form,
                                             headers: affinity ? { "X-Affinity-Key": affinity } : {} });
    affinity = affinity || response.headers.get("X-Affinity-Key");
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || `HTTP ${response.status}`);
    }
    for await (const { event, data } of sseEvents(response)) {
      if (event === "status") status.textContent = data.status + "…";
      else if (event === "token") {
        if (firstToken === null) { firstToken = performance.now() - t0; status.remove(); }
        tokens += 1;
        text.append(data.text);
      } else if (event === "done") {
        session = data.session;
        if (format) showParsed(answer, text.textContent);
        const t = data.timings;
        const rate = t.ms_per_token ? (1000 / t.ms_per_token).toFixed(1) : "–";
        $("stats").textContent = `first token ${(firstToken / 1000).toFixed(2)} s · ${rate} tokens/s · ` +
          `${t.completion_tokens} tokens` + (t.reused_session ? " · continued the conversation" : "");
        $("stats").dataset.firstToken = (firstToken / 1000).toFixed(3);
        $("stats").dataset.tokens = String(t.completion_tokens);
        $("stats").dataset.finish = data.finish_reason;
      } else if (event === "error") throw new Error(data.message);
    }
  } catch (err) {
    status.remove();
    showError(err.message);
  } finally {
    $("send").disabled = false;
  }
}

$("pick").addEventListener("click", () => $("file").click());
$("file").addEventListener("change", (e) => setImage(e.target.files[0]));
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => { e.preventDefault(); drop.classList.remove("over"); setImage(e.dataTransfer.files[0]); });
drop.addEventListener("click", (e) => { if (e.target === drop || e.target.id === "preview") $("file").click(); });
$("ask").addEventListener("submit", (e) => {
  e.preventDefault();
  const q = $("question").value.trim();
  if (!image) { showError("Choose an image first."); return; }
  if (q) { $("question").value = ""; ask(q); }
});
$("json").addEventListener("change", () => { $("schema-box").hidden = !$("json").checked; });
fetch("/v1/models").then((r) => r.json()).then((b) => { $("model").textContent = b.data[0].id; }).catch(() => {});
