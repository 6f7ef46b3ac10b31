/* signal.c — a polite stop: the first SIGINT (Ctrl-C), SIGTERM (kill, a scheduler's stop) or
 * SIGHUP (a closed terminal) sets a flag the experiment runner checks between steps, so the
 * run file is closed cleanly and marked interrupted; the handler then restores the default
 * action, so a second signal stops the process at once. Lua cannot be called from a signal
 * handler, and LuaJIT's own interrupt hook does not fire inside compiled traces, hence a flag
 * in C. */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include <signal.h>

static volatile sig_atomic_t interrupted; /* the signal number, 0 when none */
static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};

static void on_stop(int sig) {
    interrupted = sig;
    signal(sig, SIG_DFL);
}

void pn_interrupt_install(void) {
    interrupted = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++) sigaction(stop_signals[i], &sa, NULL);
}

int pn_interrupted(void) { return interrupted; }
void pn_interrupt_clear(void) {
    interrupted = 0;
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++) signal(stop_signals[i], SIG_DFL);
}
