/* An LD_PRELOAD shim: a bind() to the wildcard address (0.0.0.0, ::) binds to a loopback
 * address instead, while LOCOJAX_BIND_IP (an address in 127.0.0.0/8) is set in the process's
 * environment; without it every bind() passes through unchanged. Ray's gRPC servers (GCS,
 * raylet, every worker and the driver's core worker) always listen on the wildcard address;
 * a local Ray cluster of a LoCoJAX run sets LOCOJAX_BIND_IP so that none of them is reachable
 * from another machine (locojax/runtime/process/loopback.py). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

/* The loopback address to bind to; 0 when LOCOJAX_BIND_IP is unset or not in 127/8. */
static int loopback(struct in_addr *ip) {
  const char *text = getenv("LOCOJAX_BIND_IP");
  return text && inet_pton(AF_INET, text, ip) == 1 && (ntohl(ip->s_addr) >> 24) == 127;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  static bind_fn real;
  struct in_addr ip;
  if (!real) real = (bind_fn)dlsym(RTLD_NEXT, "bind");
  if (!addr || !loopback(&ip)) return real(fd, addr, len);
  if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in a;
    memcpy(&a, addr, sizeof a);
    if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
      a.sin_addr = ip;
      return real(fd, (const struct sockaddr *)&a, sizeof a);
    }
  } else if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a;
    memcpy(&a, addr, sizeof a);
    if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
      int v6only = 0;
      socklen_t n = sizeof v6only;
      getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &n);
      if (v6only) {
        a.sin6_addr = in6addr_loopback;
      } else { /* a dual-stack socket: the IPv4 loopback address, v4-mapped */
        memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
        a.sin6_addr.s6_addr[10] = 0xff;
        a.sin6_addr.s6_addr[11] = 0xff;
        memcpy(&a.sin6_addr.s6_addr[12], &ip, 4);
      }
      return real(fd, (const struct sockaddr *)&a, sizeof a);
    }
  }
  return real(fd, addr, len);
}
