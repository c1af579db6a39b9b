// The node's sandbox ("pause") container: holds a pod's namespaces, reaps the
// zombies it inherits as the pod's PID 1 and exits on SIGINT or SIGTERM. Built
// statically by scripts/node.sh into an image of its own (the node has no
// registry to pull registry.k8s.io/pause from).
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("distrain pause 1");
    return 0;
  }
  if (getpid() != 1) fprintf(stderr, "pause: warning: not PID 1\n");
  struct sigaction stop = {.sa_handler = on_stop};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0) {
    fprintf(stderr, "pause: sigaction: %s\n", strerror(errno));
    return 1;
  }
  for (;;) pause();
}
