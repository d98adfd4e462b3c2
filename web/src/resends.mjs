// When the page sends a message again: ReliableChannel's resend policy, replaced.
//
// Theory of operation
// -------------------
// ReliableChannel (sdk 0.0.36) resends an unacknowledged message every retryIntervalMs,
// ten times, then stops for good, without telling anyone. It resends while offline too,
// which uses up the ten attempts. And all pending messages resend in step, so a page back
// from an outage with many lines pending pushes them all at once, every interval. A
// service node's LightPush rate limit (5/s per peer by default, bursts of 100) then
// answers 429, and those attempts are lost as well. The first soak run lost 192 lines of
// a page that way: the others waited for them forever.
//
// Here a message is resent until it is acknowledged, and never while the service node is
// not connected. The delay between two sends of one message starts at the channel's
// interval and doubles up to MAX_DELAY_MS. When the link comes back, every pending message
// is rescheduled at the first interval, PACE_MS apart, so a backlog drains at a steady
// rate. The object has the two methods ReliableChannel calls on its retry manager.

const MAX_DELAY_MS = 60_000;
const PACE_MS = 250; // at most 4 resends a second after an outage: under the default limit

export class Resends {
  constructor(firstDelayMs, isConnected) {
    this.firstDelayMs = firstDelayMs;
    this.isConnected = isConnected;
    this.pending = new Map(); // message id → {resend, delayMs, timer}
  }

  /** ReliableChannel: a message was sent; `resend()` sends it again. */
  startRetries(messageId, resend) {
    this.stopRetries(messageId);
    this.pending.set(messageId, { resend, delayMs: this.firstDelayMs, timer: undefined });
    this._schedule(messageId, this.firstDelayMs);
  }

  /** ReliableChannel: the message was acknowledged. */
  stopRetries(messageId) {
    clearTimeout(this.pending.get(messageId)?.timer);
    this.pending.delete(messageId);
  }

  /** The link is back: every pending message soon, one every PACE_MS. */
  resume() {
    let offsetMs = 0;
    for (const [messageId, entry] of this.pending) {
      entry.delayMs = this.firstDelayMs;
      this._schedule(messageId, offsetMs);
      offsetMs += PACE_MS;
    }
  }

  _schedule(messageId, delayMs) {
    const entry = this.pending.get(messageId);
    clearTimeout(entry.timer);
    entry.timer = setTimeout(() => this._fire(messageId, entry), delayMs);
  }

  _fire(messageId, entry) {
    const current = () => this.pending.get(messageId) === entry;
    if (!current()) return;
    if (this.isConnected()) void entry.resend();
    // The resend may have settled the message at once (acknowledged, or sent anew under
    // the same id): then this entry is gone, and so is its schedule.
    if (!current()) return;
    entry.delayMs = Math.min(entry.delayMs * 2, MAX_DELAY_MS);
    this._schedule(messageId, entry.delayMs);
  }
}
