// The page: the open conversation and its turns, the conversation list kept on the server
// (/v1/conversations), the settings panel, and the live panel from /health and /metrics.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const { el } = KilnRender;
  const SETTINGS = ["system", "preset", "temperature", "top_p", "top_k", "seed", "max_tokens",
    "budget", "budget-unit", "logprobs", "exact", "schema", "tools", "tool_choice", "adapter", "compose"];
  const state = {
    conv: { id: null, title: null, messages: [] },
    controller: null, // the running turn's AbortController
    editing: null, // index of the message being edited
    streaming: null, // the assistant message being streamed
  };

  // -- settings ---------------------------------------------------------------------------------
  function settings() {
    const s = {};
    for (const id of SETTINGS) {
      const input = $(id);
      s[id === "budget-unit" ? "budgetUnit" : id] = input.type === "checkbox" ? input.checked : input.value;
    }
    return s;
  }
  function restoreSettings() {
    let saved = {};
    try { saved = JSON.parse(localStorage.getItem("kiln.settings") || "{}"); } catch (_) { /* fresh */ }
    for (const id of SETTINGS) {
      if (!(id in saved)) continue;
      const input = $(id);
      if (input.type === "checkbox") input.checked = !!saved[id]; else input.value = saved[id];
    }
  }
  function saveSettings() {
    const out = {};
    for (const id of SETTINGS) out[id] = $(id).type === "checkbox" ? $(id).checked : $(id).value;
    localStorage.setItem("kiln.settings", JSON.stringify(out));
  }

  // -- rendering --------------------------------------------------------------------------------
  const handlers = {
    edit: (i) => { state.editing = i; render(); },
    cancelEdit: () => { state.editing = null; render(); },
    saveEdit: (i, text) => {
      state.editing = null;
      state.conv.messages = state.conv.messages.slice(0, i);
      state.conv.messages.push({ role: "user", content: text });
      turn();
    },
    regenerate: (i) => { state.conv.messages = state.conv.messages.slice(0, i); turn(); },
    toolResults: (i) => { // one result per call, then the model goes on
      const results = [];
      for (const call of state.conv.messages[i].meta.tool_calls) {
        const text = prompt(`Result of ${call.function.name}(${call.function.arguments})`);
        if (text === null) return;
        results.push({ role: "tool", content: text, meta: { tool_call_id: call.id, name: call.function.name } });
      }
      state.conv.messages.push(...results);
      turn();
    },
    provenance: (i) => KilnApi.download(`kiln-provenance-${state.conv.id || "unsaved"}-${i}.json`,
      KilnChat.provenance(state.conv, i)),
  };

  function messageNode(msg, i, streaming) {
    const last = i === state.conv.messages.length - 1;
    return KilnRender.message(msg, i, handlers, {
      streaming, editing: state.editing === i, last, busy: !!state.controller,
      logprobView: $("logprobs").checked,
    });
  }

  function render() {
    const box = $("messages");
    box.replaceChildren(...state.conv.messages.map((m, i) => messageNode(m, i, false)));
    if (state.streaming) box.append(messageNode(state.streaming, state.conv.messages.length, true));
    box.scrollTop = box.scrollHeight;
    $("send").hidden = !!state.controller;
    $("stop").hidden = !state.controller;
  }

  let frame = 0;
  function renderStreaming() { // at most once a frame
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      const box = $("messages");
      const node = messageNode(state.streaming, state.conv.messages.length, true);
      const old = box.querySelector("article.streaming");
      node.classList.add("streaming");
      if (old) old.replaceWith(node); else box.append(node);
      box.scrollTop = box.scrollHeight;
    });
  }

  function showError(text) {
    $("error").textContent = text || "";
    $("error").hidden = !text;
  }

  // -- a turn -----------------------------------------------------------------------------------
  async function turn() {
    showError("");
    let body;
    try { body = KilnChat.requestBody(state.conv.messages, settings()); } catch (e) { showError(e.message); render(); return; }
    state.controller = new AbortController();
    state.streaming = { role: "assistant", content: "", reasoning_content: "", meta: {} };
    render();
    const signal = state.controller.signal;
    const msg = body.stream
      ? await KilnChat.stream(body, signal, (m) => { state.streaming = m; renderStreaming(); })
      : await KilnChat.once(body, signal);
    if (frame) { cancelAnimationFrame(frame); frame = 0; }
    state.streaming = null;
    state.controller = null;
    state.conv.messages.push(msg);
    render();
    live();
    await save();
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  async function send(ev) {
    ev.preventDefault();
    const text = $("prompt").value;
    if (!text.trim() || state.controller) return;
    $("prompt").value = "";
    state.conv.messages.push({ role: "user", content: text });
    render();
    await turn();
  }

  // -- conversations on the server --------------------------------------------------------------
  async function save() {
    try {
      const messages = state.conv.messages;
      if (!state.conv.id) {
        const first = messages.find((m) => m.role === "user");
        const title = first ? first.content.trim().slice(0, 60) || "New conversation" : "New conversation";
        const made = await KilnApi.post("/v1/conversations", { title, messages, settings: settings() });
        state.conv.id = made.id; state.conv.title = made.title;
        history.replaceState(null, "", `#${made.id}`);
      } else {
        await KilnApi.patch(`/v1/conversations/${state.conv.id}`, { messages, settings: settings() });
      }
    } catch (e) {
      showError(`could not save the conversation: ${e.message}`);
    }
    await refreshList();
  }

  const STORAGE_TEXT = {
    sqlite: ["saved on the server (SQLite)", "Kept in the database under --data-dir: they survive a restart."],
    memory: ["kept in server memory", "Kept in memory: they are gone when the server stops (start it with --data-dir to keep them)."],
  };

  async function refreshList() {
    let list;
    try { list = await KilnApi.get("/v1/conversations"); } catch (e) { showError(e.message); return; }
    const [text, title] = STORAGE_TEXT[list.storage] || [list.storage, ""];
    $("storage-note").textContent = `Conversations ${text}`;
    $("storage-note").title = title;
    $("storage-note").dataset.storage = list.storage;
    $("conversations").replaceChildren(...list.data.map((c) => el("li", {
      class: c.id === state.conv.id ? "current" : "", "data-id": c.id,
    }, [
      el("button", { type: "button", class: "open", text: c.title, title: `${c.message_count} messages`, onclick: () => open(c.id) }),
      el("span", { class: "row-actions" }, [
        el("button", { type: "button", class: "rename", title: "Rename", text: "✎", onclick: () => rename(c) }),
        el("button", { type: "button", class: "export", title: "Export as JSON", text: "⬇", onclick: () => exportConv(c) }),
        el("button", { type: "button", class: "delete", title: "Delete", text: "✕", onclick: () => remove(c) }),
      ]),
    ])));
  }

  async function open(id) {
    if (state.controller) return;
    try {
      const conv = await KilnApi.get(`/v1/conversations/${id}`);
      state.conv = { id: conv.id, title: conv.title, messages: conv.messages };
      history.replaceState(null, "", `#${conv.id}`);
      state.editing = null;
      render();
      refreshList();
    } catch (e) { showError(e.message); }
  }

  async function rename(c) {
    const title = prompt("Rename the conversation", c.title);
    if (!title || !title.trim()) return;
    try { await KilnApi.patch(`/v1/conversations/${c.id}`, { title: title.trim().slice(0, 200) }); } catch (e) { showError(e.message); }
    refreshList();
  }

  async function exportConv(c) {
    try { KilnApi.download(`${c.id}.json`, await KilnApi.get(`/v1/conversations/${c.id}/export`)); } catch (e) { showError(e.message); }
  }

  async function remove(c) {
    if (!confirm(`Delete "${c.title}"?`)) return;
    try { await KilnApi.del(`/v1/conversations/${c.id}`); } catch (e) { showError(e.message); }
    if (c.id === state.conv.id) newChat();
    refreshList();
  }

  function newChat() {
    if (state.controller) return;
    state.conv = { id: null, title: null, messages: [] };
    history.replaceState(null, "", location.pathname);
    render();
    refreshList();
  }

  // -- the live panel ---------------------------------------------------------------------------
  let lastTokens = null;
  function metric(text, name, label) {
    for (const line of text.split("\n")) {
      if (line.startsWith(name) && (!label || line.includes(label)) && !line.startsWith("#")) {
        return Number(line.slice(line.lastIndexOf(" ") + 1));
      }
    }
    return null;
  }
  async function live() {
    const rows = [];
    try {
      const health = await KilnApi.get("/health");
      $("model-name").textContent = health.model || "";
      rows.push(["status", health.scheduler ? `${health.status} (${health.scheduler})` : health.status]);
      const plan = health.compute_plan || {};
      rows.push(["compute plan", Object.entries(plan).map(([k, v]) => `${k}: ${v}`).join(", ")]);
      const text = await KilnApi.get("/metrics");
      const running = metric(text, "kiln_engine{", 'name="running"');
      const waiting = metric(text, "kiln_engine{", 'name="waiting"');
      const used = metric(text, "kiln_engine{", 'name="kv_blocks_used"');
      const total = metric(text, "kiln_engine{", 'name="kv_blocks_total"');
      const tokens = metric(text, "kiln_tokens_total{", 'kind="generation"');
      rows.push(["running / waiting", `${running} / ${waiting}`]);
      if (total) rows.push(["KV cache", `${used} of ${total} blocks (${(100 * used / total).toFixed(1)}%)`]);
      const now = performance.now();
      if (lastTokens && tokens !== null) rows.push(["generated", `${((tokens - lastTokens[1]) / ((now - lastTokens[0]) / 1000)).toFixed(1)} tok/s`]);
      if (tokens !== null) lastTokens = [now, tokens];
    } catch (e) {
      rows.push(["metrics", e.status === 401 ? "need the API key (--metrics-require-auth)" : e.message]);
    }
    $("live-panel").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
  }

  async function adapters() {
    try {
      const list = await KilnApi.get("/v1/adapters");
      const chosen = $("adapter").value;
      for (const a of list.available || []) $("adapter").append(el("option", { value: a.name, text: a.name }));
      $("adapter").value = chosen;
    } catch (_) { /* no adapters */ }
  }

  // -- the API key ------------------------------------------------------------------------------
  function askKey() {
    return new Promise((resolve) => {
      const dialog = $("key-dialog");
      $("key-input").value = KilnApi.apiKey();
      dialog.onclose = () => resolve(dialog.returnValue === "ok" ? $("key-input").value.trim() : null);
      dialog.showModal();
    });
  }

  // -- start ------------------------------------------------------------------------------------
  KilnApi.onAskKey(askKey);
  restoreSettings();
  for (const id of SETTINGS) $(id).addEventListener("change", () => { saveSettings(); if (id === "logprobs") render(); });
  $("composer").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);
  $("key-button").addEventListener("click", async () => { const k = await askKey(); if (k !== null) KilnApi.setApiKey(k); refreshList(); });
  render();
  (async () => {
    await refreshList();
    const wanted = location.hash.slice(1);
    if (wanted) await open(wanted);
    await adapters();
    document.body.dataset.ready = "true";
  })();
  live();
  setInterval(live, 2000);
})();
