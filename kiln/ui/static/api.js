// The page's one way to the server: every call carries the API key when one is set (the server
// started with --api-key answers 401 without it; the page then asks for the key and retries),
// errors come back as the API's envelope, and a chat stream is read as server-sent events.
"use strict";

const KilnApi = (() => {
  const KEY_STORE = "kiln.apiKey";
  let askKey = null; // set by the page: () => Promise<string|null>
  let asking = null; // the one question open now: calls that meet a 401 meanwhile share it

  const apiKey = () => localStorage.getItem(KEY_STORE) || "";
  const setApiKey = (key) => (key ? localStorage.setItem(KEY_STORE, key) : localStorage.removeItem(KEY_STORE));

  class ApiError extends Error {
    constructor(status, body) {
      const err = (body && body.error) || {};
      super(err.message || `HTTP ${status}`);
      this.status = status;
      this.code = err.code || null;
    }
  }

  async function request(method, path, body, { signal, raw = false } = {}) {
    for (let attempt = 0; ; attempt++) {
      const headers = {};
      if (body !== undefined) headers["content-type"] = "application/json";
      if (apiKey()) headers.authorization = `Bearer ${apiKey()}`;
      const res = await fetch(path, {
        method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
      });
      if (res.status === 401 && askKey && attempt < 3) {
        const sent = headers.authorization;
        if (!asking) asking = askKey().finally(() => { asking = null; });
        const key = sent === (apiKey() ? `Bearer ${apiKey()}` : undefined) ? await asking : apiKey();
        if (key) { setApiKey(key); continue; }
      }
      if (!res.ok) {
        let parsed = null;
        try { parsed = await res.json(); } catch (_) { /* not JSON */ }
        throw new ApiError(res.status, parsed);
      }
      if (raw) return res;
      const type = res.headers.get("content-type") || "";
      return type.includes("json") ? res.json() : res.text();
    }
  }

  // Server-sent events of a response: calls onEvent(parsedJson) per data line until [DONE].
  async function readEvents(res, onEvent) {
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).trimStart()).join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        onEvent(JSON.parse(data));
      }
    }
  }

  // Save a JSON value as a file in the browser's downloads.
  function download(name, value) {
    const blob = new Blob([JSON.stringify(value, null, 2)], { type: "application/json" });
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = name;
    document.body.appendChild(a);
    a.click();
    setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
  }

  return {
    request, readEvents, download, apiKey, setApiKey, ApiError,
    onAskKey: (fn) => { askKey = fn; },
    get: (p, o) => request("GET", p, undefined, o),
    post: (p, b, o) => request("POST", p, b, o),
    patch: (p, b, o) => request("PATCH", p, b, o),
    del: (p, o) => request("DELETE", p, undefined, o),
  };
})();
