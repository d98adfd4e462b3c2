// The page's Waku light node and its one service node: the store node that served the page.
//
// Theory of operation
// -------------------
// The page trusts nothing but the node it came from. `config.json` (from that node) names
// the node's WebSocket addresses, its cluster and the shards it relays; the light node
// dials those and nothing else: no bootstrap list, no discovery. libp2p in a browser
// refuses to dial private addresses by default, which is exactly where a node on
// 127.0.0.1 lives, so the connection gater is told that dialing is decided here.
//
// A link reports four things to the page, as they change: the connection (connecting,
// connected, offline), and through the channel code the subscription and the store
// catch-up. While the service node is not connected, the link redials it with a growing
// delay (0.5 s doubling to 8 s); when the browser says it is offline the link hangs up,
// and redials at once when it is back online.
// Every (re)connection runs `onConnected`: the page subscribes again and catches up from
// the store. Each failed round of dials says why (`lastError`), and reads `config.json`
// again, at most once per LAST_REDIAL_MS: a node whose key was rotated has a new peer id,
// which only the node's own config can tell, so the link then dials the new addresses.
// A dial that another identity answers (the rotated node, at the same address) reads it
// at once, and keeps that connection if the config names the identity that answered.

import { webSockets } from "@libp2p/websockets";
import { all as anyWebSocketAddress } from "@libp2p/websockets/filters";
import { multiaddr } from "@multiformats/multiaddr";
import { createLightNode, waku } from "@waku/sdk";

const FIRST_REDIAL_MS = 500;
const LAST_REDIAL_MS = 8_000;
const DIAL_TIMEOUT_MS = 10_000;
const IDENTIFY_POLL_MS = 100;
const PING_PATIENCE_MS = 20_000;
// The sdk picks its service peers from the peer store, which identify fills some time
// after the connection opens: the link says "connected" once all three are listed there.
const NEEDED = [waku.StoreCodec, waku.LightPushCodec, waku.FilterCodecs.SUBSCRIBE];

export class Link extends EventTarget {
  constructor(config, fetchConfig = undefined) {
    super();
    this.fetchConfig = fetchConfig;
    this._configReadAt = Date.now();
    this._target(config);
    this.state = "connecting";
    this.connects = 0; // times the service node was connected and identified
    this.drops = 0; // times it was lost while the browser was online and the link had not hung up
    this._hangingUp = false;
    this.node = undefined;
    this._redialMs = FIRST_REDIAL_MS;
    this._timer = undefined;
    this._dialing = false;
  }

  _target(config) {
    this.config = config;
    this.addresses = config.peers.map((address) => multiaddr(address));
    this.servicePeer = this.addresses[0]?.getPeerId();
  }

  /** After a failed round: the node's addresses again, if its config says others. */
  async _reread({ now = false } = {}) {
    if (!this.fetchConfig || (!now && Date.now() - this._configReadAt < LAST_REDIAL_MS)) return;
    this._configReadAt = Date.now();
    const config = await this.fetchConfig().catch(() => undefined);
    if (!config?.peers?.length || config.peers.join(" ") === this.config.peers.join(" ")) return;
    const was = this.servicePeer;
    this._target({ ...this.config, peers: config.peers });
    if (this.servicePeer !== was) {
      this._error(`the node's identity changed (was ${was}, now ${this.servicePeer}): dialling it`);
    }
    this._redialMs = FIRST_REDIAL_MS;
  }

  get networkConfig() {
    return { clusterId: this.config.cluster_id, numShardsInCluster: this.config.num_shards };
  }

  async start() {
    if (!this.servicePeer) throw new Error("the node gave no address with a peer id to dial");
    this.node = await createLightNode({
      networkConfig: this.networkConfig,
      defaultBootstrap: false,
      libp2p: {
        transports: [webSockets({ filter: anyWebSocketAddress })],
        // libp2p hangs up on a peer whose ping is unanswered for 5 s; a node busy with a
        // burst can take that long, and a broken WebSocket is told by its close anyway.
        connectionMonitor: { pingTimeout: { minTimeout: PING_PATIENCE_MS } },
        connectionGater: { denyDialMultiaddr: () => false },
        hideWebSocketInfo: true,
      },
    });
    const libp2p = this.node.libp2p;
    libp2p.addEventListener("peer:connect", (event) => {
      if (event.detail.toString() === this.servicePeer) void this._identified(event.detail);
    });
    libp2p.addEventListener("peer:disconnect", (event) => {
      if (event.detail.toString() === this.servicePeer) this._lost();
    });
    window.addEventListener("online", () => this._online());
    window.addEventListener("offline", () => this._offline());
    await this._dial();
  }

  /** Hangs up for good: this page will not be a participant. */
  async stop() {
    clearTimeout(this._timer);
    this.stopped = true;
    await this.node.stop();
    this._set("stopped");
  }

  isConnected() {
    return this.node?.libp2p.getConnections().some((c) => c.remotePeer.toString() === this.servicePeer);
  }

  async _dial() {
    if (this.stopped || this._dialing || this.isConnected()) return;
    this._dialing = true;
    try {
      for (const address of this.addresses) {
        try {
          const connection = await this.node.libp2p.dial(address, { signal: AbortSignal.timeout(DIAL_TIMEOUT_MS) });
          if (connection.remotePeer.toString() === this.servicePeer) return;
          // Another identity answered at the node's address: a rotated key. Only the
          // node's config can say whether it is our node under its new peer id.
          this._error(`expected ${this.servicePeer} at ${address}, but ${connection.remotePeer} answered`);
          await this._reread({ now: true });
          if (this.isConnected()) return void this._identified(connection.remotePeer);
        } catch (err) {
          this._error(`cannot reach ${address}: ${err.message}`);
        }
      }
      this._set(navigator.onLine ? "connecting" : "offline");
      await this._reread();
      this._redialSoon(this._redialMs);
      this._redialMs = Math.min(this._redialMs * 2, LAST_REDIAL_MS);
    } finally {
      this._dialing = false;
    }
  }

  // A WebSocket can outlive an outage while what was pushed through it meanwhile is lost,
  // and nothing would tell the Filter client: the link hangs up when the browser goes
  // offline, so that coming back is a new connection, which the page catches up after.
  _offline() {
    this._set("offline");
    for (const connection of this.node.libp2p.getConnections()) {
      if (connection.remotePeer.toString() !== this.servicePeer) continue;
      this._hangingUp = true;
      void connection.close().catch(() => undefined);
    }
  }

  _online() {
    this._redialMs = FIRST_REDIAL_MS;
    this._redialSoon(0);
  }

  _redialSoon(delayMs) {
    clearTimeout(this._timer);
    this._timer = setTimeout(() => void this._dial(), delayMs);
  }

  async _identified(peerId) {
    const deadline = Date.now() + DIAL_TIMEOUT_MS;
    while (this.isConnected()) {
      const stored = await this.node.libp2p.peerStore.get(peerId).catch(() => undefined);
      const offered = stored?.protocols ?? [];
      if (NEEDED.every((codec) => offered.includes(codec))) return this._connected(peerId);
      if (Date.now() > deadline) {
        const lacking = NEEDED.filter((codec) => !offered.includes(codec));
        this.lastError = `the node does not offer ${lacking.join(", ")}`;
        return this._set("refused");
      }
      await new Promise((resolve) => setTimeout(resolve, IDENTIFY_POLL_MS));
    }
  }

  _connected(peerId) {
    clearTimeout(this._timer);
    // Queries name this peer: the sdk's own choice of store peer can lag behind a
    // reconnection ("No peers available to query").
    this.servicePeerId = peerId;
    this._redialMs = FIRST_REDIAL_MS;
    this.lastError = undefined;
    this.connects += 1;
    this._set("connected");
    this.dispatchEvent(new Event("connected"));
  }

  _lost() {
    if (this.stopped) return;
    if (!this._hangingUp && navigator.onLine) this.drops += 1;
    this._hangingUp = false;
    this._set(navigator.onLine ? "connecting" : "offline");
    this._redialSoon(FIRST_REDIAL_MS);
  }

  _set(state) {
    if (this.state === state) return;
    this.state = state;
    this.dispatchEvent(new Event("change"));
  }

  _error(why) {
    if (this.lastError === why) return;
    this.lastError = why;
    this.dispatchEvent(new Event("change"));
  }
}
