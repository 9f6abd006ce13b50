// Polling without overlap: the next call starts `intervalMs` after the previous one finished,
// and waits while the tab is hidden.

/**
 * Call `step()` now and then again and again until the returned stop() is called or `step`
 * returns false. Errors go to `onError(error)` (which may return false to stop).
 */
export function poll(step, intervalMs, onError = () => true) {
  let stopped = false;
  let timer = null;
  const run = async () => {
    timer = null;
    if (stopped) return;
    if (document.hidden) {
      document.addEventListener("visibilitychange", run, { once: true });
      return;
    }
    let again = true;
    try {
      again = (await step()) !== false;
    } catch (error) {
      again = onError(error) !== false;
    }
    if (again && !stopped) timer = setTimeout(run, intervalMs);
  };
  run();
  return () => {
    stopped = true;
    if (timer !== null) clearTimeout(timer);
    document.removeEventListener("visibilitychange", run);
  };
}
