/* A byte relay in C: the floor of a user-space TCP relay's CPU per request on this machine.
 *
 * benchmarks/relay_cpu.py runs the same producer through it as through the proxy. It
 * forwards bytes both ways between each accepted connection and one upstream address and
 * does nothing else: no framing, no parsing, no metrics, one thread, epoll. Per request
 * and answer that is a read and a write each way plus the epoll wake-ups, the same system
 * calls the proxy's relay makes (`tierproxy` forwards whole frames, so it reads the same
 * bytes in the same calls); whatever the proxy spends above this figure is its own.
 *
 * Usage: native_relay <listen port> <upstream host> <upstream port>   (IPv4, loopback)
 * Benchmark code, not the product's: built by relay_cpu.py with the machine's cc.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF (256 * 1024)
#define MAX_FDS 65536

static int peer_of[MAX_FDS];
static char buf[BUF];

static void nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int write_all(int fd, const char *p, ssize_t n) {
    while (n > 0) {  /* blocking sockets: the peer is another process, which drains */
        ssize_t w = write(fd, p, (size_t)n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= w;
    }
    return 0;
}

static void drop(int ep, int fd) {
    int peer = peer_of[fd];
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    if (peer >= 0) {
        epoll_ctl(ep, EPOLL_CTL_DEL, peer, NULL);
        close(peer);
        peer_of[peer] = -1;
    }
    peer_of[fd] = -1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s <listen port> <upstream host> <upstream port>\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in listen_at = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    listen_at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct sockaddr_in upstream = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
    if (inet_pton(AF_INET, argv[2], &upstream.sin_addr) != 1) {
        fprintf(stderr, "not an IPv4 address: %s\n", argv[2]);
        return 2;
    }
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&listen_at, sizeof listen_at) || listen(lfd, 128)) {
        perror("listen");
        return 1;
    }
    for (int i = 0; i < MAX_FDS; i++) peer_of[i] = -1;
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    printf("listening on %s\n", argv[1]);
    fflush(stdout);
    struct epoll_event events[64];
    for (;;) {
        int n = epoll_wait(ep, events, 64, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("epoll_wait");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == lfd) {
                int client = accept(lfd, NULL, NULL);
                if (client < 0) continue;
                int up = socket(AF_INET, SOCK_STREAM, 0);
                if (connect(up, (struct sockaddr *)&upstream, sizeof upstream) ||
                    client >= MAX_FDS || up >= MAX_FDS) {
                    close(client);
                    close(up);
                    continue;
                }
                nodelay(client);
                nodelay(up);
                peer_of[client] = up;
                peer_of[up] = client;
                struct epoll_event a = {.events = EPOLLIN, .data.fd = client};
                struct epoll_event b = {.events = EPOLLIN, .data.fd = up};
                epoll_ctl(ep, EPOLL_CTL_ADD, client, &a);
                epoll_ctl(ep, EPOLL_CTL_ADD, up, &b);
                continue;
            }
            if (peer_of[fd] < 0) continue;  /* dropped earlier in this round */
            ssize_t got = read(fd, buf, BUF);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0 || write_all(peer_of[fd], buf, got)) drop(ep, fd);
        }
    }
}
