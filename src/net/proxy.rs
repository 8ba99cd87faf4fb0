//! The PROXY protocol (HAProxy's `send-proxy`, v1 text, and
//! `send-proxy-v2`, binary): an L4 load balancer in front of the scheduler
//! (a hot standby's, say) puts the client's address before the client's
//! bytes. The scheduler needs it: a servant is told apart from one behind
//! NAT, the requester's own machine avoided and a grant's owner recognised
//! by the daemon's address, not the balancer's. Believed only from
//! `--trusted_proxies`; from them a connection without a header (a health
//! check) is served as it is.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// What a v1 header starts with.
const V1_PREFIX: &[u8] = b"PROXY ";
/// A v1 header's longest form, `\r\n` included (the specification's bound).
const V1_MAX_BYTES: usize = 107;
/// What a v2 header starts with.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// A v2 header's fixed part: signature, version and command, family, length.
const V2_FIXED_BYTES: usize = 16;
/// The longest v2 header taken (the addresses of a UNIX socket pair, 216
/// bytes, plus room for TLVs); longer ones are refused.
pub const MAX_HEADER_BYTES: usize = V2_FIXED_BYTES + 512;

/// What the first bytes of a connection from a trusted proxy say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// More bytes are needed to tell.
    Incomplete,
    /// No PROXY header: the bytes are the client's.
    Absent,
    /// A header of `len` bytes; `client` is the address it names (None for
    /// a proxy's own connection, e.g. a health check, or an unknown family).
    Present {
        len: usize,
        client: Option<SocketAddr>,
    },
    /// A header that does not parse: the connection cannot be trusted.
    Invalid,
}

/// Reads a PROXY header at the start of `buf`.
pub fn parse(buf: &[u8]) -> Header {
    let v1 = &V1_PREFIX[..buf.len().min(V1_PREFIX.len())];
    let v2 = &V2_SIGNATURE[..buf.len().min(V2_SIGNATURE.len())];
    if buf.starts_with(V1_PREFIX) {
        parse_v1(buf)
    } else if buf.starts_with(V2_SIGNATURE) {
        parse_v2(buf)
    } else if buf.starts_with(v1) || buf.starts_with(v2) {
        Header::Incomplete
    } else {
        Header::Absent
    }
}

fn parse_v1(buf: &[u8]) -> Header {
    let Some(end) = buf.windows(2).position(|pair| pair == b"\r\n") else {
        return if buf.len() >= V1_MAX_BYTES {
            Header::Invalid
        } else {
            Header::Incomplete
        };
    };
    let len = end + 2;
    if len > V1_MAX_BYTES {
        return Header::Invalid;
    }
    let Ok(line) = std::str::from_utf8(&buf[V1_PREFIX.len()..end]) else {
        return Header::Invalid;
    };
    let fields: Vec<&str> = line.split(' ').collect();
    match fields.as_slice() {
        ["UNKNOWN", ..] => Header::Present { len, client: None },
        [
            family @ ("TCP4" | "TCP6"),
            source,
            _destination,
            source_port,
            _destination_port,
        ] => {
            let ip: Option<IpAddr> = match *family {
                "TCP4" => source.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
                _ => source.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
            };
            match (ip, source_port.parse::<u16>()) {
                (Some(ip), Ok(port)) => Header::Present {
                    len,
                    client: Some(SocketAddr::new(ip, port)),
                },
                _ => Header::Invalid,
            }
        }
        _ => Header::Invalid,
    }
}

fn parse_v2(buf: &[u8]) -> Header {
    if buf.len() < V2_FIXED_BYTES {
        return Header::Incomplete;
    }
    let version_command = buf[12];
    let family = buf[13];
    let body = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let len = V2_FIXED_BYTES + body;
    if version_command >> 4 != 2 || len > MAX_HEADER_BYTES {
        return Header::Invalid;
    }
    if buf.len() < len {
        return Header::Incomplete;
    }
    let addresses = &buf[V2_FIXED_BYTES..len];
    let client = match (version_command & 0x0f, family >> 4) {
        // LOCAL: the proxy's own connection (health checks).
        (0, _) => None,
        (1, 1) if addresses.len() >= 12 => {
            let ip = Ipv4Addr::new(addresses[0], addresses[1], addresses[2], addresses[3]);
            let port = u16::from_be_bytes([addresses[8], addresses[9]]);
            Some(SocketAddr::new(IpAddr::V4(ip), port))
        }
        (1, 2) if addresses.len() >= 36 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&addresses[..16]);
            let port = u16::from_be_bytes([addresses[32], addresses[33]]);
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(octets)), port))
        }
        (1, 1 | 2) => return Header::Invalid,
        // Another family (UNIX sockets, unspecified): keep the socket's.
        (1, _) => None,
        _ => return Header::Invalid,
    };
    Header::Present { len, client }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(command: u8, family: u8, addresses: &[u8]) -> Vec<u8> {
        let mut header = V2_SIGNATURE.to_vec();
        header.push(0x20 | command);
        header.push(family);
        header.extend_from_slice(&(addresses.len() as u16).to_be_bytes());
        header.extend_from_slice(addresses);
        header
    }

    #[test]
    fn a_v1_header_names_the_client_and_is_told_from_the_clients_bytes() {
        let bytes = b"PROXY TCP4 127.0.3.4 127.0.0.1 40000 8336\r\nCPRF";
        assert_eq!(
            parse(bytes),
            Header::Present {
                len: bytes.len() - 4,
                client: Some("127.0.3.4:40000".parse().unwrap()),
            }
        );
        assert_eq!(
            parse(b"PROXY TCP6 ::1 ::1 5 6\r\n"),
            Header::Present {
                len: 24,
                client: Some("[::1]:5".parse().unwrap()),
            }
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\n"),
            Header::Present {
                len: 15,
                client: None
            }
        );
        assert_eq!(parse(b"PROXY TCP4 127.0.3.4"), Header::Incomplete);
        assert_eq!(parse(b"PRO"), Header::Incomplete);
        assert_eq!(parse(b"CPRF"), Header::Absent);
        assert_eq!(parse(b"POST /rpc/"), Header::Absent);
        assert_eq!(parse(b"PROXY TCP4 nonsense 1 2 3\r\n"), Header::Invalid);
        assert_eq!(parse(&[b'x'; 200][..]), Header::Absent);
        let mut endless = b"PROXY ".to_vec();
        endless.extend_from_slice(&[b'1'; 200]);
        assert_eq!(parse(&endless), Header::Invalid);
    }

    #[test]
    fn a_v2_header_names_the_client_or_none_for_the_proxys_own_checks() {
        let tcp4 = v2(
            1,
            0x11,
            &[127, 0, 3, 4, 127, 0, 0, 1, 0x9c, 0x40, 0x20, 0x90],
        );
        let mut bytes = tcp4.clone();
        bytes.extend_from_slice(b"CPRF");
        assert_eq!(
            parse(&bytes),
            Header::Present {
                len: tcp4.len(),
                client: Some("127.0.3.4:40000".parse().unwrap()),
            }
        );
        let mut tcp6 = vec![0u8; 36];
        tcp6[15] = 1;
        tcp6[32..34].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(
            parse(&v2(1, 0x21, &tcp6)),
            Header::Present {
                len: 52,
                client: Some("[::1]:7".parse().unwrap()),
            }
        );
        assert_eq!(
            parse(&v2(0, 0x00, &[])),
            Header::Present {
                len: 16,
                client: None
            }
        );
        assert_eq!(parse(&tcp4[..14]), Header::Incomplete);
        assert_eq!(parse(&tcp4[..20]), Header::Incomplete);
        assert_eq!(parse(&v2(1, 0x11, &[1, 2, 3])), Header::Invalid);
        assert_eq!(parse(&v2(7, 0x11, &[0; 12])), Header::Invalid);
        assert_eq!(parse(&v2(1, 0x11, &[0; 600])), Header::Invalid);
    }
}
