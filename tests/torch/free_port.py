"""A free TCP port for a test's MASTER_PORT, the way chorusrun picks one.

The port is drawn below the kernel's ephemeral range (net.ipv4.ip_local_port_range), so no other
process's bind to port 0 or connect() can be handed it after it is released here, and it is
checked free on every address and family by a wildcard bind without SO_REUSEADDR. A port from
bind(("127.0.0.1", 0)) is not safe: a socket another test binds to the host's other address with
port 0 can get the same port, and torch's store, which binds the wildcard address, then fails
with "Address already in use".
"""
import random
import socket


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bind_wildcard(port):
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        addr = ("::", port)
    except OSError:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        addr = ("0.0.0.0", port)
    try:
        s.bind(addr)
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port():
    high = _ephemeral_low() - 1
    low = max(1024, high - 16383)
    rng = random.SystemRandom()
    for _ in range(256):
        port = rng.randint(low, high)
        if _bind_wildcard(port):
            return port
    raise RuntimeError(f"no free TCP port in {low}..{high}")
