"""A delay wire, for kernels without `tc netem`: a forwarder of Ethernet frames between two TAP devices, one
inside a host's network namespace and one a port of the lab's bridge, which holds the frames the host sends
for a configurable time (its egress latency) and passes the frames sent to it at once. Standard library only.

Frames are held in userspace, so a sending socket does not see them as queued in its host: the kernel
orphans a frame once a TAP device hands it over (as netem does with what it delays), so TCP's small-queue
limit does not throttle a connection to a couple of segments per delay, as it would if the host's packets
were held in the kernel (an NFQUEUE on the host's output hook, say).

Run inside the host's namespace with the bridge-side TAP's file descriptor inherited (tests/support/netfaults.py,
`NetworkLab.delay`, opens it in the root namespace and makes the routes):

    python3 -S tests/support/delay_wire.py BRIDGE_TAP_FD HOST_TAP_NAME

It creates the host's TAP (`HOST_TAP_NAME`, gone when the forwarder exits), prints `ready`, then takes
commands on stdin, a line each, answering a line each:

- `delay SECONDS`: frames the host sends from now on are held SECONDS (0: passed at once); answers `ok`;
- `stats`: answers `stats egress=N ingress=N held=N late_max=SECONDS dropped=N` (late_max: the most a
  frame was sent after its time, the forwarder's own lag; dropped: frames the bridge-side TAP refused);
- end of input: sends every held frame and exits.
"""

from __future__ import annotations

import collections
import fcntl
import os
import select
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
MAX_FRAME = 65536
MAX_HELD = 200_000
"""Frames held at most (beyond: the oldest are sent early rather than the forwarder growing without bound)."""


def open_tap(name: str) -> int:
    """A file descriptor of TAP device `name` of this namespace (created if there is none; gone with the last fd)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def drain(fd: int, limit: int = 256) -> list[bytes]:
    """Frames readable from `fd` now (at most `limit`)."""
    frames = []
    for _ in range(limit):
        try:
            frames.append(os.read(fd, MAX_FRAME))
        except BlockingIOError:
            break
    return frames


def send(fd: int, frame: bytes) -> bool:
    try:
        os.write(fd, frame)
        return True
    except (BlockingIOError, OSError):  # A frame the device would not take is lost, as on a wire.
        return False


def main(argv: list[str]) -> None:
    bridge_fd = int(argv[1])
    os.set_blocking(bridge_fd, False)
    host_fd = open_tap(argv[2])
    delay = 0.0
    held: collections.deque[tuple[float, bytes]] = collections.deque()  # (due, frame), in the order sent.
    egress = ingress = dropped = 0
    late_max = 0.0
    stdin = sys.stdin.fileno()
    commands = b""
    print("ready", flush=True)
    while True:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
        readable, _, _ = select.select([host_fd, bridge_fd, stdin], [], [], timeout)
        now = time.monotonic()
        if host_fd in readable:
            frames = drain(host_fd)
            egress += len(frames)
            if delay > 0 or held:
                held.extend((now + delay, f) for f in frames)
            else:
                dropped += sum(not send(bridge_fd, f) for f in frames)
        while held and (held[0][0] <= now or len(held) > MAX_HELD):
            due, frame = held.popleft()
            late_max = max(late_max, now - due)
            dropped += not send(bridge_fd, frame)
        if bridge_fd in readable:
            for frame in drain(bridge_fd):
                ingress += 1
                send(host_fd, frame)
        if stdin in readable:
            data = os.read(stdin, 4096)
            if not data:
                for _due, frame in held:
                    send(bridge_fd, frame)
                return
            commands += data
            while b"\n" in commands:
                line, commands = commands.split(b"\n", 1)
                words = line.decode().split()
                if words[:1] == ["delay"] and len(words) == 2:
                    delay = max(0.0, float(words[1]))
                    print("ok", flush=True)
                elif words[:1] == ["stats"]:
                    print(f"stats egress={egress} ingress={ingress} held={len(held)} late_max={late_max:.4f} "
                          f"dropped={dropped}", flush=True)
                else:
                    print(f"error: unknown command {line!r}", flush=True)


if __name__ == "__main__":
    main(sys.argv)
