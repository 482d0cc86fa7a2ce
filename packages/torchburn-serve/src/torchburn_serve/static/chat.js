// TorchBurn's web chat: streams answers from the server's OpenAI-compatible /v1/chat/completions.
// Model output is untrusted: it only ever reaches the page through textContent.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const els = {
    messages: $("messages"),
    empty: $("empty-state"),
    prompt: $("prompt"),
    send: $("send"),
    stop: $("stop"),
    composer: $("composer"),
    settings: $("settings"),
    settingsToggle: $("settings-toggle"),
    systemPrompt: $("system-prompt"),
    temperature: $("temperature"),
    topP: $("top-p"),
    maxTokens: $("max-tokens"),
    seed: $("seed"),
    apiKey: $("api-key"),
    newChat: $("new-chat"),
    modelName: $("model-name"),
    error: $("error"),
    errorText: document.querySelector("#error .error-text"),
    errorClose: document.querySelector("#error .error-close"),
  };

  const API_KEY_STORAGE = "torchburn.apiKey";
  const DEFAULTS = { temperature: 0.7, topP: 0.95, maxTokens: 512 };

  // the conversation as sent to the server (user and assistant turns; the system prompt goes first at send time)
  let history = [];
  let modelId = null;
  let controller = null; // AbortController of the answer being streamed
  let conversation = 0; // counts "New chat"s, so that an answer cut by one does not land in the next conversation

  // ---------- small helpers ----------

  function storageGet(key) {
    try {
      return window.localStorage.getItem(key) || "";
    } catch {
      return "";
    }
  }

  function storageSet(key, value) {
    try {
      if (value) window.localStorage.setItem(key, value);
      else window.localStorage.removeItem(key);
    } catch {
      // storage may be disabled: the key then lasts for this page only
    }
  }

  function authHeaders() {
    const key = els.apiKey.value.trim();
    return key ? { Authorization: `Bearer ${key}` } : {};
  }

  function showError(message) {
    els.errorText.textContent = message;
    els.error.hidden = false;
  }

  function clearError() {
    els.errorText.textContent = "";
    els.error.hidden = true;
  }

  // the message of an error answer: OpenAI's {"error": {"message", "param", ...}}, else the status line
  async function errorMessage(response) {
    let text = "";
    try {
      text = await response.text();
    } catch {
      // the body could not be read: the status line is all there is
    }
    let message = "";
    let param = "";
    try {
      const body = JSON.parse(text);
      const err = body && body.error;
      if (err && typeof err === "object" && err.message) {
        message = String(err.message);
        if (err.param) param = String(err.param);
      } else if (typeof err === "string") {
        message = err;
      } else if (body && body.detail) {
        message = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
      }
    } catch {
      message = text.trim().slice(0, 500);
    }
    const status = `HTTP ${response.status}${response.statusText ? " " + response.statusText : ""}`;
    if (!message) return `The server answered ${status}.`;
    return `${message} (${status}${param ? `, parameter ${param}` : ""})`;
  }

  function numberSetting(input, fallback, { integer = false } = {}) {
    const raw = input.value.trim();
    if (raw === "") return fallback;
    const value = Number(raw);
    if (!Number.isFinite(value)) return fallback;
    return integer ? Math.trunc(value) : value;
  }

  function formatSeconds(ms) {
    return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
  }

  function setState(state) {
    document.body.dataset.state = state;
    const generating = state === "generating";
    els.send.hidden = generating;
    els.send.disabled = generating;
    els.stop.hidden = !generating;
    els.stop.disabled = !generating;
  }

  // ---------- the message list ----------

  function nearBottom() {
    const m = els.messages;
    return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
  }

  function scrollToBottom() {
    els.messages.scrollTop = els.messages.scrollHeight;
  }

  function addMessage(role, text) {
    els.empty.hidden = true;
    const item = document.createElement("div");
    item.className = `message ${role}`;
    const bubble = document.createElement("div");
    bubble.className = "bubble";
    const content = document.createElement("div");
    content.className = "content";
    content.textContent = text;
    bubble.append(content);
    item.append(bubble);
    if (role === "assistant") {
      const stats = document.createElement("div");
      stats.className = "stats";
      item.append(stats);
    }
    els.messages.append(item);
    scrollToBottom();
    return { item, bubble, content, stats: item.querySelector(".stats") };
  }

  function thinkingOf(view) {
    if (!view.thinking) {
      const box = document.createElement("details");
      box.className = "thinking";
      box.open = true;
      const summary = document.createElement("summary");
      summary.textContent = "Thinking";
      const text = document.createElement("div");
      text.className = "thinking-text";
      box.append(summary, text);
      view.bubble.insertBefore(box, view.content);
      view.thinking = { box, text };
    }
    return view.thinking;
  }

  function markStopped(view) {
    const tag = document.createElement("span");
    tag.className = "stopped";
    tag.textContent = "(stopped)";
    view.bubble.append(tag);
  }

  function clearConversation() {
    if (controller) controller.abort();
    conversation += 1;
    history = [];
    for (const node of [...els.messages.querySelectorAll(".message")]) node.remove();
    els.empty.hidden = false;
    clearError();
    els.prompt.focus();
  }

  // ---------- the model ----------

  async function loadModel() {
    try {
      const response = await fetch("/v1/models", { headers: authHeaders() });
      if (!response.ok) {
        els.modelName.textContent = "no model";
        showError(`Could not list the models: ${await errorMessage(response)}`);
        return null;
      }
      const body = await response.json();
      const first = body && Array.isArray(body.data) ? body.data[0] : null;
      modelId = first && first.id ? String(first.id) : null;
      els.modelName.textContent = modelId || "no model";
      els.modelName.title = modelId || "";
      if (modelId) document.title = `${modelId} · TorchBurn chat`;
      return modelId;
    } catch (err) {
      els.modelName.textContent = "offline";
      showError(`Could not reach the server: ${err.message}`);
      return null;
    }
  }

  // ---------- streaming ----------

  // Reads server-sent events from a fetch response, calling onData with each event's data field;
  // returns true when the stream ended with "data: [DONE]".
  async function readEvents(response, onData) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    const handle = (block) => {
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("data:")) data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
        // other fields (event:, id:, retry:) and comments (": ...") carry nothing for us
      }
      if (data.length === 0) return false;
      const payload = data.join("\n");
      if (payload.trim() === "[DONE]") return true;
      onData(payload);
      return false;
    };
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) !== -1) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          if (handle(block)) return true;
        }
      }
      buffer += decoder.decode().replace(/\r\n?/g, "\n");
      return buffer.trim() ? handle(buffer) : false;
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  function settingsBody(messages) {
    const body = {
      model: modelId,
      messages,
      stream: true,
      stream_options: { include_usage: true },
      temperature: numberSetting(els.temperature, DEFAULTS.temperature),
      top_p: numberSetting(els.topP, DEFAULTS.topP),
      max_tokens: numberSetting(els.maxTokens, DEFAULTS.maxTokens, { integer: true }),
    };
    const seed = numberSetting(els.seed, null, { integer: true });
    if (seed !== null) body.seed = seed;
    return body;
  }

  async function send() {
    const text = els.prompt.value;
    if (!text.trim() || controller) return;
    clearError();
    if (!modelId && !(await loadModel())) return;

    els.prompt.value = "";
    autosize();
    const asked = addMessage("user", text);
    history.push({ role: "user", content: text });
    const turnOf = conversation;

    const system = els.systemPrompt.value.trim();
    const messages = system ? [{ role: "system", content: system }, ...history] : [...history];
    const view = addMessage("assistant", "");
    view.item.classList.add("pending");

    controller = new AbortController();
    setState("generating");

    const started = performance.now();
    let firstAt = null;
    let lastAt = null;
    let pieces = 0;
    let usage = null;
    let finishReason = null;
    let answer = "";
    let outcome = "done"; // done | stopped | error | cut

    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json", ...authHeaders() },
        body: JSON.stringify(settingsBody(messages)),
        signal: controller.signal,
      });
      if (!response.ok) {
        showError(await errorMessage(response));
        outcome = "error";
      } else {
        const finished = await readEvents(response, (payload) => {
          let chunk;
          try {
            chunk = JSON.parse(payload);
          } catch {
            return; // not JSON: nothing to show
          }
          if (chunk.error) {
            const err = chunk.error;
            showError(typeof err === "string" ? err : String(err.message || JSON.stringify(err)));
            outcome = "error";
            return;
          }
          if (chunk.usage) usage = chunk.usage;
          const choice = Array.isArray(chunk.choices) ? chunk.choices[0] : null;
          if (!choice) return;
          if (choice.finish_reason) finishReason = choice.finish_reason;
          const piece = choice.delta && choice.delta.content;
          // a reasoning model's thinking (reasoning_content) shows apart, folded once the answer starts
          const thought = choice.delta && choice.delta.reasoning_content;
          for (const [text, isThought] of [[thought, true], [piece, false]]) {
            if (typeof text !== "string" || text.length === 0) continue;
            const now = performance.now();
            if (firstAt === null) {
              firstAt = now;
              view.item.classList.remove("pending");
            }
            lastAt = now;
            pieces += 1;
            const follow = nearBottom();
            if (isThought) {
              thinkingOf(view).text.append(text); // a text node: never parsed as HTML
            } else {
              answer += text;
              if (view.thinking) view.thinking.box.open = false;
              view.content.append(text);
            }
            if (follow) scrollToBottom();
          }
        });
        if (!finished && outcome === "done") {
          outcome = "cut";
          showError("The connection closed before the answer was complete.");
        }
      }
    } catch (err) {
      if (err && err.name === "AbortError") {
        outcome = "stopped";
      } else {
        outcome = "error";
        showError(`Could not reach the server: ${err && err.message ? err.message : err}`);
      }
    } finally {
      controller = null;
    }

    view.item.classList.remove("pending");
    if (outcome === "stopped") markStopped(view);
    if (outcome === "error") {
      view.item.classList.add("failed");
      if (!answer) asked.item.classList.add("failed");
    }

    // the stats line: tokens, tokens per second (first token to last), time to first token
    const parts = [];
    if (firstAt !== null) {
      const tokens = usage && Number.isFinite(usage.completion_tokens) ? usage.completion_tokens : null;
      const count = tokens !== null ? tokens : pieces;
      const approx = tokens === null ? "~" : "";
      parts.push(`${approx}${count} token${count === 1 ? "" : "s"}`);
      const seconds = (lastAt - firstAt) / 1000;
      parts.push(seconds > 0 ? `${approx}${(count / seconds).toFixed(1)} tok/s` : "– tok/s");
      parts.push(`first token ${formatSeconds(firstAt - started)}`);
    } else if (outcome === "stopped") {
      parts.push("stopped before the first token");
    } else if (outcome === "done") {
      parts.push(usage ? `${usage.completion_tokens} tokens, no text` : "no text");
    }
    if (finishReason === "length") parts.push("max tokens reached");
    view.stats.textContent = parts.join(" · ");
    if (!view.stats.textContent) view.stats.hidden = true;

    if (turnOf !== conversation) {
      // "New chat" was pressed meanwhile: this turn belongs to a conversation that is gone
    } else if (answer) {
      history.push({ role: "assistant", content: answer });
    } else {
      // nothing came back: the turn is dropped so that the next question does not follow an unanswered one
      history.pop();
      view.item.classList.add("empty");
    }
    setState("idle");
    if (nearBottom()) scrollToBottom();
    els.prompt.focus();
  }

  function stop() {
    if (controller) controller.abort();
  }

  // ---------- the composer and settings ----------

  function autosize() {
    els.prompt.style.height = "auto";
    els.prompt.style.height = `${Math.min(els.prompt.scrollHeight, 220)}px`;
  }

  els.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  els.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  els.prompt.addEventListener("input", autosize);
  els.stop.addEventListener("click", stop);
  els.newChat.addEventListener("click", clearConversation);
  els.errorClose.addEventListener("click", clearError);
  els.settingsToggle.addEventListener("click", () => {
    const open = els.settings.hidden;
    els.settings.hidden = !open;
    els.settingsToggle.setAttribute("aria-expanded", String(open));
    els.settingsToggle.classList.toggle("active", open);
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && controller) stop();
  });

  els.apiKey.value = storageGet(API_KEY_STORAGE);
  els.apiKey.addEventListener("change", () => {
    storageSet(API_KEY_STORAGE, els.apiKey.value.trim());
    clearError();
    loadModel();
  });

  setState("idle");
  loadModel();
  els.prompt.focus();
})();
