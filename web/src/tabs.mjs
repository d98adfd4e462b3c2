// One participant per name and channel among the tabs of one browser.
//
// Tabs of one browser share localStorage, so a second tab opened on the same URL is, by
// default, the same participant. @waku/sds ignores messages that carry its own sender id,
// so the two tabs would never see each other's messages. A tab that runs a channel answers
// every claim on its (channel, name) over a BroadcastChannel. A new tab claims its own and
// listens for an answer for CLAIM_WAIT_MS.

const CLAIM_WAIT_MS = 250;
const tabs = typeof BroadcastChannel === "undefined" ? undefined : new BroadcastChannel("sdsync-chat");

/** Whether no other tab of this browser is `name` in `channel`; if so, the name is ours. */
export async function claimName(channel, name) {
  if (tabs === undefined) return true;
  // getRandomValues, not randomUUID: the latter exists only in secure contexts.
  const me = Array.from(crypto.getRandomValues(new Uint32Array(4)), (n) => n.toString(16)).join("");
  const taken = await new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), CLAIM_WAIT_MS);
    tabs.addEventListener("message", function answered(event) {
      if (event.data?.kind !== "taken" || event.data.to !== me) return;
      clearTimeout(timer);
      tabs.removeEventListener("message", answered);
      resolve(true);
    });
    tabs.postMessage({ kind: "claim", channel, name, from: me });
  });
  if (taken) return false;
  tabs.addEventListener("message", (event) => {
    const { kind, from } = event.data ?? {};
    if (kind === "claim" && event.data.channel === channel && event.data.name === name) {
      tabs.postMessage({ kind: "taken", to: from });
    }
  });
  return true;
}
