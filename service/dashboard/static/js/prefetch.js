// Starts the first API reads of a job page while the page's modules are still loading (a classic
// script in <head>, run before them): api() takes each prefetched answer once, for the same path.
(() => {
  const token = localStorage.getItem("tunehub.token");
  const job = /^\/dashboard\/jobs\/(\d+)$/.exec(location.pathname);
  if (!token || !job) return;
  const headers = { Authorization: `Bearer ${token}` };
  const paths = [`/jobs/${job[1]}`, `/jobs/${job[1]}/history?after=0`];
  const started = new Map(paths.map((path) => {
    const response = fetch(`/api/v1${path}`, { headers });
    response.catch(() => {}); // a failure surfaces where the answer is taken, not as unhandled
    return [path, response];
  }));
  started.token = token;
  window.tunehubPrefetch = started;
})();
