// The page's DOM: what chat.html declares, filled from a ChatLog and the link's states.
// Text from the network only ever goes through textContent, never markup.

const LINK_TEXT = {
  connecting: "connecting…",
  connected: "connected",
  offline: "offline (the browser has no network)",
  refused: "refused",
  stopped: "not connected",
};

// How a state of our lines reads, where the word alone would mislead.
const STATE_TEXT = { sending: "waiting for the node" };

export class View {
  constructor(doc) {
    this.doc = doc;
    const byId = (id) => doc.getElementById(id);
    this.el = {
      channel: byId("channel"),
      me: byId("me"),
      connection: byId("connection"),
      subscription: byId("subscription"),
      catchUp: byId("catchup"),
      error: byId("error"),
      missing: byId("missing"),
      log: byId("log"),
      participants: byId("participants"),
      join: byId("join"),
      compose: byId("compose"),
      text: byId("text"),
      send: byId("send"),
    };
    this.items = new Map(); // message id → its <li>
  }

  /** The form that asks for a channel and a name (plain GET: no script needed). */
  showJoin(channel, name, why) {
    this.el.join.hidden = false;
    this.el.compose.hidden = true;
    this.doc.getElementById("join-channel").value = channel;
    this.doc.getElementById("join-name").value = name;
    if (why) this.showError(why);
  }

  showChannel(channel, me) {
    this.el.channel.textContent = channel;
    this.el.me.textContent = me;
    this.doc.title = `${channel} · sdsync chat`;
  }

  /** Enables the compose form; `send(text)` answers an error text, or nothing. */
  onSend(send) {
    this.el.compose.hidden = false;
    this.el.compose.addEventListener("submit", (event) => {
      event.preventDefault();
      const problem = send(this.el.text.value);
      if (problem) return this.showError(problem);
      this.clearError();
      this.el.text.value = "";
      this.el.text.focus();
    });
  }

  showError(text) {
    this.el.error.textContent = text;
    this.el.error.hidden = false;
  }

  clearError() {
    this.el.error.hidden = true;
    this.el.error.textContent = "";
  }

  /** A status line: its state (data-state, for styling and tests) and its words. */
  setStatus(which, state, words) {
    const element = this.el[which];
    element.dataset.state = state;
    element.textContent = words ?? LINK_TEXT[state] ?? state;
  }

  /** How often the link has connected (a reconnection shows as 2 and on), and how often
   * the node was lost though the browser was online and the page had not hung up. */
  countConnects(count, drops) {
    this.el.connection.dataset.connects = String(count);
    this.el.connection.dataset.drops = String(drops);
  }

  render(log) {
    this.renderLog(log);
    this.renderParticipants(log);
    const missing = log.missing.size;
    this.el.missing.hidden = missing === 0;
    this.el.missing.dataset.count = String(missing);
    this.el.missing.textContent =
      missing === 1 ? "Waiting for 1 earlier message…" : `Waiting for ${missing} earlier messages…`;
  }

  renderLog(log) {
    const list = this.el.log;
    const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
    let previous = null;
    for (const entry of log.ordered()) {
      const item = this.items.get(entry.messageId) ?? this.newItem(entry);
      this.fill(item, log, entry);
      const wanted = previous === null ? list.firstChild : previous.nextSibling;
      if (wanted !== item) list.insertBefore(item, wanted);
      previous = item;
    }
    if (atBottom) list.scrollTop = list.scrollHeight;
  }

  newItem(entry) {
    const item = this.doc.createElement("li");
    item.dataset.id = entry.messageId;
    item.dataset.sender = entry.senderId;
    const sender = this.doc.createElement("span");
    sender.className = "sender";
    sender.textContent = entry.senderId;
    const text = this.doc.createElement("span");
    text.className = "text";
    text.textContent = entry.text;
    const state = this.doc.createElement("span");
    state.className = "state";
    item.append(sender, text, state);
    this.items.set(entry.messageId, item);
    return item;
  }

  fill(item, log, entry) {
    item.dataset.lamport = entry.lamport?.toString() ?? "";
    const state = log.stateOf(entry.messageId);
    item.classList.toggle("mine", entry.senderId === log.me);
    if (item.dataset.state === state) return;
    item.dataset.state = state;
    const badge = item.querySelector(".state");
    const count = log.acks.get(entry.messageId);
    badge.textContent = state === "possibly acknowledged" && count ? `${state} (${count})` : (STATE_TEXT[state] ?? state);
    badge.title = log.errors.get(entry.messageId) ?? "";
  }

  renderParticipants(log) {
    const names = [...log.participants].sort();
    const shown = [...this.el.participants.children].map((li) => li.textContent);
    if (shown.join("\n") === names.join("\n")) return;
    this.el.participants.replaceChildren(
      ...names.map((name) => {
        const li = this.doc.createElement("li");
        li.textContent = name;
        if (name === log.me) li.className = "me";
        return li;
      })
    );
  }
}
