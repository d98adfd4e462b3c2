// Lines typed in the page, kept in the browser until the group has them.
//
// Theory of operation
// -------------------
// A line lives in the page's memory until the channel has sent it and the others have
// acknowledged it; a reload, a closed tab or a crash of the browser in between would lose
// it, and a line typed while the node is down waits exactly there. So each line is also
// written to localStorage when it is typed (under the channel and the participant's name,
// which a reload keeps) and removed when it is acknowledged — or when the node's store
// turns out to hold it after a reload, since the node then accepted it and the others
// will have it from the store. At start the page shows every kept line as waiting and
// sends it again once it has caught up with the store (chat.mjs).
//
// localStorage rather than IndexedDB: a handful of short lines, read once at start and
// written as they are typed, need no transactions, and a synchronous write is done before
// the page can be closed. A browser that refuses the write (storage full, or disabled)
// still sends the line; `add` says so, and the page shows why the line would not survive
// a reload.

const PREFIX = "sdsync.chat.pending";

export class PendingLines {
  constructor(storage, channelId, me) {
    this.storage = storage;
    this.key = `${PREFIX}.${channelId}.${me}`;
  }

  /** Every kept line, oldest first: [{messageId, text}]. */
  all() {
    try {
      const lines = JSON.parse(this.storage.getItem(this.key) ?? "[]");
      return Array.isArray(lines) ? lines.filter((l) => typeof l?.messageId === "string" && typeof l.text === "string") : [];
    } catch {
      return []; // unreadable (another version wrote it, or a user edited it): start over
    }
  }

  /** Keeps a line; undefined when kept, else why not. */
  add(messageId, text) {
    const lines = this.all();
    if (lines.some((line) => line.messageId === messageId)) return undefined;
    return this._write([...lines, { messageId, text }]);
  }

  /** Forgets a line (acknowledged, or found in the store); whether it was kept. */
  remove(messageId) {
    const lines = this.all();
    const left = lines.filter((line) => line.messageId !== messageId);
    if (left.length === lines.length) return false;
    this._write(left);
    return true;
  }

  _write(lines) {
    try {
      if (lines.length === 0) this.storage.removeItem(this.key);
      else this.storage.setItem(this.key, JSON.stringify(lines));
      return undefined;
    } catch (err) {
      return `this browser did not keep the line (${err?.message ?? err}): it is lost if the page is closed before it is sent`;
    }
  }
}
