//! Which local address the data sockets use: `HCCL_SOCKET_IFNAME` in NCCL's syntax, or by
//! default the address this host uses to reach `MASTER_ADDR`.
//!
//! Syntax: a comma-separated list of interface name prefixes (`eth,ib`); a leading `^`
//! excludes the listed interfaces instead (`^docker,lo`); a leading `=` (after the `^` if
//! any) makes the names exact rather than prefixes (`=eth0`, `^=docker0`).

use std::net::{IpAddr, SocketAddr, UdpSocket};

pub use crate::config::IfSpec;

/// One address of a local interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub ip: IpAddr,
}

/// The local interfaces and their addresses.
pub fn interfaces() -> std::io::Result<Vec<Iface>> {
    Ok(if_addrs::get_if_addrs()?
        .into_iter()
        .map(|i| Iface {
            ip: i.ip(),
            name: i.name,
        })
        .collect())
}

/// Picks the address for data sockets: the first interface `spec` allows (IPv4 before
/// IPv6, loopback last unless it is the only kind allowed), or without a spec the address
/// that routes to `master` (finding it sends nothing).
pub fn choose(spec: Option<&IfSpec>, master: SocketAddr, ifs: &[Iface]) -> Result<Iface, String> {
    match spec {
        Some(spec) => {
            let mut allowed: Vec<&Iface> = ifs.iter().filter(|i| spec.matches(&i.name)).collect();
            allowed.sort_by_key(|i| (i.ip.is_loopback(), i.ip.is_ipv6()));
            allowed.first().map(|i| (*i).clone()).ok_or_else(|| {
                let names: Vec<&str> = ifs.iter().map(|i| i.name.as_str()).collect();
                format!("no interface matches HCCL_SOCKET_IFNAME (interfaces here: {names:?})")
            })
        }
        None => {
            let bind: SocketAddr = if master.is_ipv4() {
                "0.0.0.0:0".parse().expect("literal")
            } else {
                "[::]:0".parse().expect("literal")
            };
            let probe = UdpSocket::bind(bind)
                .and_then(|s| s.connect(master).map(|()| s))
                .and_then(|s| s.local_addr())
                .map_err(|e| format!("no route to MASTER_ADDR {master}: {e}"))?;
            let ip = probe.ip();
            let name = ifs
                .iter()
                .find(|i| i.ip == ip)
                .map_or_else(|| "?".to_string(), |i| i.name.clone());
            Ok(Iface { name, ip })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_syntax() {
        let cases = [
            ("eth", "eth0", true),
            ("eth", "ens3", false),
            ("eth,ib", "ib0", true),
            ("^docker,lo", "docker0", false),
            ("^docker,lo", "eth0", true),
            ("=eth0", "eth0", true),
            ("=eth0", "eth01", false),
            ("^=eth0", "eth01", true),
            ("^=eth0", "eth0", false),
            (" veth , lo ", "lo", true),
        ];
        for (spec, name, want) in cases {
            assert_eq!(
                IfSpec::parse(spec).unwrap().matches(name),
                want,
                "{spec} vs {name}"
            );
        }
        assert!(IfSpec::parse("").is_err());
        assert!(IfSpec::parse("^=").is_err());
        assert!(IfSpec::parse(" , ").is_err());
    }

    #[test]
    fn choice_prefers_ipv4_and_non_loopback() {
        let ifs = vec![
            Iface {
                name: "lo".into(),
                ip: "127.0.0.1".parse().unwrap(),
            },
            Iface {
                name: "eth0".into(),
                ip: "fe80::1".parse().unwrap(),
            },
            Iface {
                name: "eth0".into(),
                ip: "198.18.0.2".parse().unwrap(),
            },
        ];
        let m: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let all = IfSpec::parse("^docker").unwrap();
        assert_eq!(
            choose(Some(&all), m, &ifs).unwrap().ip.to_string(),
            "198.18.0.2"
        );
        let lo = IfSpec::parse("lo").unwrap();
        assert_eq!(choose(Some(&lo), m, &ifs).unwrap().name, "lo");
        let none = IfSpec::parse("ib").unwrap();
        assert!(choose(Some(&none), m, &ifs).unwrap_err().contains("eth0"));
        // The default follows the route to the master: loopback here.
        let real = interfaces().unwrap();
        let got = choose(None, m, &real).unwrap();
        assert_eq!(got.ip.to_string(), "127.0.0.1");
        assert_eq!(got.name, "lo");
    }
}
