// Polar console: the only script. Pages work without it; it adds "expand all" buttons and keyboard paging.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  // <button data-expand="selector" data-open="true|false">: open or close every <details> matching selector.
  for (const button of document.querySelectorAll("button[data-expand]")) {
    button.addEventListener("click", () => {
      const open = button.dataset.open === "true";
      for (const details of document.querySelectorAll(button.dataset.expand)) details.open = open;
    });
  }
  // "[" and "]" follow the page's rel=prev / rel=next links (the trajectory viewer's pages).
  document.addEventListener("keydown", (event) => {
    if (event.target instanceof HTMLInputElement || event.ctrlKey || event.metaKey || event.altKey) return;
    const rel = { "[": "prev", "]": "next" }[event.key];
    const link = rel && document.querySelector(`a[rel="${rel}"]`);
    if (link) window.location.assign(link.href);
  });
});
