// Live updates: one websocket per page, reconnect with backoff, banner while down.
// Pages register handlers with Faultline.on(type, fn). After a reconnect, pages that
// asked for it (Faultline.onResync) refetch state so no update is lost.
(function () {
  "use strict";
  const handlers = {};
  const resyncs = [];
  let socket = null;
  let attempt = 0;
  let everConnected = false;

  function wsUrl(topic) {
    const port = document.body.dataset.wsPort;
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const host = port ? location.hostname + ":" + port : location.host;
    return proto + "//" + host + "/ws/live/" + encodeURIComponent(topic) + "/";
  }

  function banner(show) {
    const el = document.getElementById("live-banner");
    if (el) el.hidden = !show;
  }

  function connect(topic) {
    socket = new WebSocket(wsUrl(topic));
    socket.onopen = function () {
      attempt = 0;
      banner(false);
      document.body.dataset.live = "up";
      if (everConnected) resyncs.forEach(function (fn) { fn(); });
      everConnected = true;
    };
    socket.onmessage = function (msg) {
      const event = JSON.parse(msg.data);
      (handlers[event.type] || []).forEach(function (fn) { fn(event.data, event); });
    };
    socket.onclose = function () {
      document.body.dataset.live = "down";
      banner(true);
      attempt += 1;
      setTimeout(function () { connect(topic); }, Math.min(10000, 250 * 2 ** attempt));
    };
  }

  window.Faultline = {
    on: function (type, fn) { (handlers[type] = handlers[type] || []).push(fn); },
    onResync: function (fn) { resyncs.push(fn); },
    start: connect,
  };
})();
