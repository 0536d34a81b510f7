// mgit serve: the little the pages do in the browser. Filters submit when a choice changes;
// a diff being computed is polled (bounded in count) until it is done, then the page reloads.
// Nothing here writes HTML: text goes in as textContent.
"use strict";
(function () {
  for (const select of document.querySelectorAll("select[data-autosubmit]")) {
    select.addEventListener("change", () => select.form.submit());
  }

  const box = document.getElementById("diff-progress");
  if (box) {
    const bar = box.querySelector("progress");
    const state = document.getElementById("diff-state");
    const bytes = document.getElementById("diff-bytes");
    const size = (n) => {
      let v = n;
      for (const unit of ["B", "KiB", "MiB", "GiB"]) {
        if (Math.abs(v) < 1024) return unit === "B" ? `${v.toFixed(0)} B` : `${v.toFixed(1)} ${unit}`;
        v /= 1024;
      }
      return `${v.toFixed(1)} TiB`;
    };
    let polls = 0;
    const MAX_POLLS = 3600; // half a second apart: half an hour at most
    const poll = () => {
      polls += 1;
      fetch(box.getAttribute("data-poll"), { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then((r) => r.json())
        .then((d) => {
          if (d.state === "done" || d.state === "error" || d.error) { window.location.reload(); return; }
          state.textContent = d.state;
          bar.max = Math.max(d.total, 1);
          bar.value = d.done;
          bytes.textContent = `${size(d.done)} of ${size(d.total)}`;
          if (polls < MAX_POLLS) setTimeout(poll, 500);
          else state.textContent = "still running: reload the page to look again";
        })
        .catch(() => { if (polls < MAX_POLLS) setTimeout(poll, 2000); });
    };
    setTimeout(poll, 300);
  }
})();
