// The dashboard's own script: no framework, nothing to build.
// 1. <time datetime> elements are shown in the viewer's time zone (their
//    title keeps UTC). 2. A run's log is followed over server-sent events:
//    new text is appended as it comes, the stream closes at its end.
(function () {
  "use strict";

  var FORMAT = {
    year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit",
    hour12: false, timeZoneName: "short"
  };

  function localize(root) {
    if (!root || !root.querySelectorAll) { return; }
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var moment = new Date(el.getAttribute("datetime"));
      if (isNaN(moment.getTime())) { return; }
      var options = Object.assign({}, FORMAT);
      if (el.dataset.precision === "ms") { options.fractionalSecondDigits = 3; }
      el.textContent = new Intl.DateTimeFormat(undefined, options).format(moment);
    });
  }

  function follow(pre) {
    var status = document.getElementById("log-status");
    var source = new EventSource(pre.dataset.events);
    function say(text) { if (status) { status.textContent = text; } }
    source.addEventListener("attempt", function () { say("following live"); });
    source.addEventListener("chunk", function (event) {
      var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.appendChild(document.createTextNode(JSON.parse(event.data).text));
      if (atBottom) { pre.scrollTop = pre.scrollHeight; }
    });
    source.addEventListener("end", function (event) {
      source.close();
      pre.dataset.complete = "true";
      say("complete (the run is " + JSON.parse(event.data).state + ")");
    });
    source.addEventListener("error", function () {
      if (pre.dataset.complete !== "true") { say("connection lost, reconnecting"); }
    });
  }

  localize(document);
  document.addEventListener("htmx:load", function (event) { localize(event.detail.elt); });
  var log = document.getElementById("log");
  if (log && log.dataset.events && window.EventSource) { follow(log); }
})();
