"""RDMA netlink client: request bytes, reply parsing, and the socket path against a fake kernel.

Expected bytes are computed by hand from the wire format (netlink(7); include/uapi/rdma/rdma_netlink.h):
nlmsghdr = u32 len, u16 type, u16 flags, u32 seq, u32 pid (host byte order), then 4-byte
aligned attributes u16 len (header included, padding excluded), u16 type, value, zero padding.
"""

from __future__ import annotations

import errno
import socket
import struct
import sys
import threading

import pytest

from rdmanet.cni.linux import rdma_netlink as rn

NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3


def hdr(length: int, mtype: int, flags: int, seq: int, pid: int) -> bytes:
    return struct.pack("=IHHII", length, mtype, flags, seq, pid)


def attr(atype: int, value: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(value), atype) + value
    return raw + b"\0" * (-len(raw) % 4)


def message(mtype: int, flags: int, seq: int, pid: int, body: bytes = b"") -> bytes:
    return hdr(16 + len(body), mtype, flags, seq, pid) + body


def error_message(code: int, request: bytes) -> bytes:
    """NLMSG_ERROR as the kernel's netlink_ack() builds it: int error (negative errno, 0 for an
    ack), then the request's nlmsghdr (ack) or the whole request (error)."""
    seq, pid = struct.unpack_from("=II", request, 8)
    echoed = request if code else request[:16]
    flags = 0 if code else 0x100  # NLM_F_CAPPED: payload cut to the header
    return message(NLMSG_ERROR, flags, seq, pid, struct.pack("=i", -code) + echoed)


def done_message(seq: int, pid: int) -> bytes:
    return message(NLMSG_DONE, NLM_F_MULTI, seq, pid, struct.pack("=i", 0))


def walk_attrs(payload: bytes) -> list[tuple[int, bytes]]:
    """Split a TLV chain, asserting the alignment rules, into (type, value) pairs."""
    out, off = [], 0
    while off < len(payload):
        length, atype = struct.unpack_from("=HH", payload, off)
        assert length >= 4
        out.append((atype, payload[off + 4 : off + length]))
        padded = (length + 3) & ~3
        assert payload[off + length : off + padded] == b"\0" * (padded - length)
        off += padded
    assert off == len(payload)
    return out


def dev_body(index: int, name: str, extra: bytes = b"") -> bytes:
    return attr(1, struct.pack("=I", index)) + attr(2, name.encode() + b"\0") + extra


# ------------------------------------------------------------------ constants and requests


def test_message_types():
    assert rn.nldev_type(rn.RDMA_NLDEV_CMD_GET) == 0x1401
    assert rn.nldev_type(rn.RDMA_NLDEV_CMD_SET) == 0x1402
    assert rn.nldev_type(rn.RDMA_NLDEV_CMD_SYS_GET) == 0x1406
    assert (rn.NETLINK_RDMA, rn.RDMA_NL_NLDEV) == (20, 5)
    assert (rn.RDMA_NLDEV_SYS_ATTR_NETNS_MODE, rn.RDMA_NLDEV_NET_NS_FD) == (66, 68)


def test_sys_get_bytes():
    data = rn.request_bytes(rn.sys_get_request(), seq=7, pid=4242)
    assert data == hdr(16, 0x1406, NLM_F_REQUEST | NLM_F_ACK, 7, 4242)
    assert len(data) == 16  # no family header, no attributes


def test_get_dump_bytes():
    data = rn.request_bytes(rn.get_dump_request(), seq=1, pid=99)
    assert data == hdr(16, 0x1401, NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP, 1, 99)
    assert struct.unpack_from("=H", data, 6)[0] == 0x305


def test_set_netns_bytes():
    data = rn.request_bytes(rn.set_netns_request(3, 9), seq=0x1234, pid=0x10000)
    expected = (
        hdr(32, 0x1402, NLM_F_REQUEST | NLM_F_ACK, 0x1234, 0x10000)
        + struct.pack("=HHI", 8, 1, 3)  # DEV_INDEX u32
        + struct.pack("=HHI", 8, 68, 9)  # NET_NS_FD u32
    )
    assert data == expected
    # attributes follow the 16-byte header directly; DEV_NAME (2) is never sent
    assert walk_attrs(data[16:]) == [(1, struct.pack("=I", 3)), (68, struct.pack("=I", 9))]


@pytest.mark.skipif(sys.byteorder != "little", reason="literal is little-endian")
def test_set_netns_bytes_literal():
    data = rn.request_bytes(rn.set_netns_request(3, 9), seq=7, pid=42)
    assert data.hex() == (
        "20000000" "0214" "0500" "07000000" "2a000000"  # len 32, 0x1402, REQUEST|ACK, seq, pid
        "0800" "0100" "03000000"  # DEV_INDEX = 3
        "0800" "4400" "09000000"  # NET_NS_FD = 9
    )


def test_set_netns_extreme_values():
    data = rn.request_bytes(rn.set_netns_request(0xFFFFFFFF, 0), seq=0, pid=0)
    assert walk_attrs(data[16:]) == [(1, b"\xff" * 4), (68, b"\0" * 4)]


@pytest.mark.parametrize(
    "index, fd", [(-1, 3), (2**32, 3), (1, -1), (True, 3), ("1", 3), (1, None)]
)
def test_set_netns_rejects_bad_values(index, fd):
    with pytest.raises(ValueError):
        rn.set_netns_request(index, fd)


def test_request_bytes_is_repeatable():
    msg = rn.get_dump_request()
    assert rn.request_bytes(msg, seq=5, pid=6) == rn.request_bytes(msg, seq=5, pid=6)
    assert rn.request_bytes(msg, seq=8, pid=6)[8:12] == struct.pack("=I", 8)


# ------------------------------------------------------------------ reply parsing


def test_parse_get_dump_reply():
    # attributes the client does not name: 16 (string) and 17 (u64), plus NDEV_INDEX/NDEV_NAME
    extra0 = attr(16, b"16.35.2000\0") + attr(17, struct.pack("=Q", 0x0C42A10300AB_CDEF))
    extra1 = attr(50, struct.pack("=I", 4)) + attr(51, b"ens1f1np1\0")
    data = (
        message(0x1401, NLM_F_MULTI, 9, 77, dev_body(0, "mlx5_0", extra0))
        + message(0x1401, NLM_F_MULTI, 9, 77, dev_body(1, "mlx5_1", extra1))
        + done_message(9, 77)
    )
    msgs = rn.parse_reply(data)
    assert len(msgs) == 2
    assert rn.devices_from_messages(msgs) == [
        rn.RdmaDevice(0, "mlx5_0"),
        rn.RdmaDevice(1, "mlx5_1"),
    ]
    assert msgs[1].get_attr("RDMA_NLDEV_ATTR_NDEV_NAME") == "ens1f1np1"
    assert msgs[1].get_attr("RDMA_NLDEV_ATTR_NDEV_INDEX") == 4


def test_parse_empty_dump():
    assert rn.devices_from_messages(rn.parse_reply(done_message(1, 1))) == []


def test_device_without_name_is_a_protocol_error():
    data = message(0x1401, NLM_F_MULTI, 1, 1, attr(1, struct.pack("=I", 0))) + done_message(1, 1)
    with pytest.raises(OSError) as e:
        rn.devices_from_messages(rn.parse_reply(data))
    assert e.value.errno == errno.EPROTO


@pytest.mark.parametrize("value, mode", [(0, "exclusive"), (1, "shared")])
def test_parse_sys_get_reply(value, mode):
    body = attr(66, bytes([value]))
    assert len(body) == 8  # u8 value: length 5, padded to 8
    msgs = rn.parse_reply(message(0x1406, 0, 3, 3, attr(81, b"\x01") + body))
    assert rn.netns_mode_from_messages(msgs) == mode


def test_sys_get_reply_without_mode():
    assert rn.netns_mode_from_messages(rn.parse_reply(message(0x1406, 0, 3, 3))) is None


def test_sys_get_unknown_mode_value():
    with pytest.raises(OSError) as e:
        rn.netns_mode_from_messages(rn.parse_reply(message(0x1406, 0, 3, 3, attr(66, b"\x07"))))
    assert e.value.errno == errno.EPROTO


def test_parse_error_reply_raises_errno():
    request = rn.request_bytes(rn.set_netns_request(3, 9), seq=11, pid=5)
    with pytest.raises(OSError) as e:
        rn.parse_reply(error_message(errno.ENODEV, request))
    assert e.value.errno == errno.ENODEV
    assert not isinstance(e.value, rn.RdmaNetlinkUnavailable)


def test_parse_ack_is_dropped():
    request = rn.request_bytes(rn.set_netns_request(3, 9), seq=11, pid=5)
    assert rn.parse_reply(error_message(0, request)) == []


# ------------------------------------------------------------------ socket path, fake kernel


class FakeKernel:
    """Answers one request on the other end of a datagram socketpair.

    ``answer(request) -> list[bytes]`` builds the reply datagrams from the request bytes (so
    seq/pid match what pyroute2 allocated); any failure still answers, with an EPROTO error,
    so the client never waits forever.
    """

    def __init__(self, answer):
        self.client, self.kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.kernel.settimeout(10)
        self.requests: list[bytes] = []
        self.answer = answer
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            request = self.kernel.recv(65536)
        except OSError:
            return
        self.requests.append(request)
        try:
            replies = self.answer(request)
        except Exception:
            replies = [error_message(errno.EPROTO, request)]
        for reply in replies:
            self.kernel.send(reply)

    def close(self):
        self.thread.join(10)
        self.client.close()
        self.kernel.close()


@pytest.fixture
def fake_kernel():
    made = []

    def make(answer):
        made.append(FakeKernel(answer))
        return made[-1]

    yield make
    for k in made:
        k.close()


def seq_pid(request: bytes) -> tuple[int, int]:
    return struct.unpack_from("=II", request, 8)


def test_socket_netns_mode(fake_kernel):
    def answer(req):
        seq, pid = seq_pid(req)
        return [message(0x1406, 0, seq, pid, attr(66, b"\x00")), error_message(0, req)]

    k = fake_kernel(answer)
    with rn.RdmaNetlink(use_socket=k.client) as nl:
        assert nl.netns_mode() == "exclusive"
    seq, pid = seq_pid(k.requests[0])
    assert k.requests[0] == rn.request_bytes(rn.sys_get_request(), seq=seq, pid=pid)


def test_socket_netns_mode_old_kernel(fake_kernel):
    k = fake_kernel(lambda req: [error_message(errno.EINVAL, req)])  # no SYS_GET handler
    with rn.RdmaNetlink(use_socket=k.client) as nl:
        assert nl.netns_mode() is None


def test_socket_list_devices(fake_kernel):
    def answer(req):
        seq, pid = seq_pid(req)
        return [
            message(0x1401, NLM_F_MULTI, seq, pid, dev_body(2, "mlx5_2")),
            message(0x1401, NLM_F_MULTI, seq, pid, dev_body(5, "rxe0")),
            done_message(seq, pid),
        ]

    k = fake_kernel(answer)
    with rn.RdmaNetlink(use_socket=k.client) as nl:
        assert nl.list_devices() == [rn.RdmaDevice(2, "mlx5_2"), rn.RdmaDevice(5, "rxe0")]
    seq, pid = seq_pid(k.requests[0])
    assert k.requests[0] == rn.request_bytes(rn.get_dump_request(), seq=seq, pid=pid)


def test_socket_device_by_name(fake_kernel):
    def answer(req):
        seq, pid = seq_pid(req)
        body = dev_body(2, "mlx5_2")
        return [message(0x1401, NLM_F_MULTI, seq, pid, body), done_message(seq, pid)]

    k = fake_kernel(answer)
    with rn.RdmaNetlink(use_socket=k.client) as nl:
        assert nl.device_by_name("mlx5_2") == rn.RdmaDevice(2, "mlx5_2")
    k2 = fake_kernel(lambda req: [done_message(*seq_pid(req))])
    with rn.RdmaNetlink(use_socket=k2.client) as nl:
        assert nl.device_by_name("mlx5_2") is None


def test_socket_move_device_ack(fake_kernel):
    k = fake_kernel(lambda req: [error_message(0, req)])
    with rn.RdmaNetlink(use_socket=k.client) as nl:
        assert nl.move_device(7, 12) is None
    seq, pid = seq_pid(k.requests[0])
    assert k.requests[0] == rn.request_bytes(rn.set_netns_request(7, 12), seq=seq, pid=pid)


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EPERM, errno.ENODEV, errno.EBADF])
def test_socket_move_device_error(fake_kernel, code):
    k = fake_kernel(lambda req: [error_message(code, req)])
    with rn.RdmaNetlink(use_socket=k.client) as nl:
        with pytest.raises(OSError) as e:
            nl.move_device(7, 12)
    assert e.value.errno == code
    assert "index 7" in str(e.value)


def test_socket_skips_a_late_answer_to_an_earlier_request(fake_kernel):
    # answers carrying another sequence number (left by an earlier, interrupted request) are not
    # this request's: neither a refusal, nor a DONE, nor a device
    def answer(req):
        seq, pid = seq_pid(req)
        late = seq + 1000
        return [
            error_message(errno.ENODEV, rn.request_bytes(rn.set_netns_request(1, 2), seq=late, pid=pid)),
            message(0x1401, NLM_F_MULTI, late, pid, dev_body(9, "late0")),
            done_message(late, pid),
            message(0x1401, NLM_F_MULTI, seq, pid, dev_body(5, "rxe0")),
            done_message(seq, pid),
        ]

    k = fake_kernel(answer)
    with rn.RdmaNetlink(use_socket=k.client) as nl:
        assert nl.list_devices() == [rn.RdmaDevice(5, "rxe0")]


def test_socket_is_broken_after_an_undecodable_answer(fake_kernel):
    # an error whose echoed request claims 32 bytes but carries 16: the exchange stops half-way,
    # so the socket may still hold the rest of that answer; the next request is refused
    def answer(req):
        seq, pid = seq_pid(req)
        return [message(NLMSG_ERROR, 0, seq, pid, struct.pack("=i", -errno.ENODEV) + req[:16])]

    k = fake_kernel(answer)
    with rn.RdmaNetlink(use_socket=k.client) as nl:
        with pytest.raises(OSError) as first:
            nl.move_device(3, 9)
        with pytest.raises(OSError) as second:
            nl.netns_mode()
    assert first.value.errno == errno.EPROTO
    assert second.value.errno == errno.EIO
    assert len(k.requests) == 1  # the second request was never sent


def test_requests_on_one_socket_each_get_their_own_answer():
    # several requests on one socket (as host-device's DEL makes): each its own sequence number,
    # each answered by the ACK carrying it
    client, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    peer.settimeout(10)
    seen = []

    def serve():
        for _ in range(3):
            req = peer.recv(65536)
            seen.append(seq_pid(req)[0])
            peer.send(error_message(0, req))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with rn.RdmaNetlink(use_socket=client) as nl:
            for index in (1, 2, 3):
                nl.move_device(index, 9)
    finally:
        t.join(10)
        peer.close()
    assert len(set(seen)) == 3


def test_socket_refuses_other_thread():
    # pyroute2 would open a second socket in the other thread's netns; the client refuses.
    client, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    seen = []
    try:
        with rn.RdmaNetlink(use_socket=client) as nl:
            t = threading.Thread(target=lambda: seen.append(_catch(nl.list_devices)))
            t.start()
            t.join(10)
    finally:
        client.close()
        peer.close()
    assert isinstance(seen[0], RuntimeError)


def _catch(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - returned to the test
        return e
    return None


def test_truncated_reply_is_a_protocol_error():
    # an error whose echoed request claims 32 bytes but carries only 16
    request = rn.request_bytes(rn.set_netns_request(3, 9), seq=11, pid=5)
    seq, pid = seq_pid(request)
    bad = message(NLMSG_ERROR, 0, seq, pid, struct.pack("=i", -errno.ENODEV) + request[:16])
    with pytest.raises(OSError) as e:
        rn.parse_reply(bad)
    assert e.value.errno == errno.EPROTO
