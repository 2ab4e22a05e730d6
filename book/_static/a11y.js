// Accessibility fixes for markup the theme and Sphinx produce (checked by axe-core in
// tests/test_browser.py).
// The bibliography is a <div role="list"> whose entries carry role="doc-biblioentry",
// which is not a list item: assistive technology then announces an empty list. Drop the
// list role, so the entries are read as the citations they are.
document.addEventListener("DOMContentLoaded", () => {
  for (const list of document.querySelectorAll('.citation-list[role="list"]')) {
    list.removeAttribute("role");
  }
});
