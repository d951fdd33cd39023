// Group page: incidents of this group update live.
(function () {
  "use strict";
  const page = document.getElementById("group-page");
  Faultline.on("incident.changed", function () { location.reload(); });
  Faultline.onResync(function () { location.reload(); });
  Faultline.start("group:" + page.dataset.group);
})();
