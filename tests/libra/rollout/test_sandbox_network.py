"""The sandbox's network: a call reaches no route, no name and no socket but unix ones, whatever
the arguments it gives the socket calls (the system-call filter, `libra.rollout.seccomp`)."""

import socket

import pytest

from tests.libra.rollout.test_sandbox import attack, open_episode


@pytest.fixture
def episode(tmp_path, config):
    return open_episode("math", config, tmp_path / "work")


def test_the_network_is_unreachable(episode, host):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        code = ("import socket\nprint(repr(open('/proc/net/route').read().splitlines()[1:]))\n"
                f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('connected')\n"
                "except OSError as e:\n    print('refused', e.errno)\n"
                "try:\n    socket.getaddrinfo('example.com', 80)\n    print('resolved')\nexcept OSError as e:\n    print('no dns')\n"
                "for family in (socket.AF_INET6, socket.AF_NETLINK, socket.AF_PACKET, 40):\n    try:\n"
                "        socket.socket(family, socket.SOCK_RAW if family in (socket.AF_NETLINK, socket.AF_PACKET) else "
                "socket.SOCK_STREAM)\n        print('made', family)\n    except OSError as e:\n        print(e.errno)\n"
                # the kernel reads the family as an int: high bits set make the same family
                "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
                "libc.syscall.argtypes = [ctypes.c_long] * 5\nSOCKET, SOCKETPAIR = 41, 53\n"
                "pair = (ctypes.c_int * 2)()\n"
                "for family, kind in ((2, 1), (16, 3), (40, 1), (38, 5), (30, 5), (21, 5)):\n"
                "    made = libc.syscall(SOCKET, family | 1 << 32, kind, 0, 0)\n"
                "    paired = libc.syscall(SOCKETPAIR, family | 1 << 32, kind, 0, ctypes.addressof(pair))\n"
                "    print('high', family, made if made >= 0 else ctypes.get_errno(), paired)\n"
                "a, b = socket.socketpair()\na.send(b'unix')\nprint(b.recv(4).decode())")
        output, status = attack(episode, host, code)
        routes, loopback, dns, *families, unix = output.splitlines()
        assert routes == "[]" and loopback == "refused 97" and dns == "no dns"  # no route, no inet socket at all
        # netlink and TCP buffers are not charged to the call's memory cgroup, other families load
        # kernel modules: no such sockets (97: EAFNOSUPPORT), whatever the argument's upper half;
        # unix sockets work
        assert families[:4] == ["97"] * 4 and unix == "unix"
        assert families[4:] == [f"high {family} 97 -1" for family in (2, 16, 40, 38, 30, 21)]
    finally:
        server.close()
