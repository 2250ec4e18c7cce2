//! The text the `portcullis-inspect` tool prints: `Display` for [`Summary`] and
//! [`Verification`].

use std::fmt::{self, Display, Formatter};

use super::{Finding, Summary, Verification};
use crate::fence::FenceKind;

impl Display for Summary {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(f, "store {}", self.directory)?;
        writeln!(f, "\nfiles:")?;
        for (name, bytes) in &self.files {
            writeln!(f, "  {name:<32} {bytes:>12} bytes")?;
        }
        let o = &self.open;
        writeln!(f, "\nopen read:")?;
        if o.rebuilt_by_full_scan {
            writeln!(
                f,
                "  no usable manifest or snapshot: the whole journal was read to rebuild them"
            )?;
        } else {
            writeln!(f, "  snapshot: {} bytes", o.snapshot_bytes)?;
        }
        writeln!(
            f,
            "  journal after the snapshot: {} records, {} bytes",
            o.records_scanned, o.journal_bytes_scanned
        )?;
        match &o.torn_tail {
            Some(t) => writeln!(
                f,
                "  torn tail: {} bytes at segment {} offset {} (open truncates them)",
                t.bytes_dropped, t.segment, t.offset
            )?,
            None => writeln!(f, "  torn tail: none")?,
        }
        writeln!(f, "  damaged records: {}", o.damaged.len())?;
        for d in &o.damaged {
            writeln!(
                f,
                "    segment {} offset {}: partition {}",
                d.segment,
                d.offset,
                d.partition.as_deref().unwrap_or("(unknown)")
            )?;
        }
        let d = &self.damage;
        if d.is_empty() {
            writeln!(f, "\nrefused by the store: nothing")?;
        } else {
            writeln!(
                f,
                "\nrefused by the store (persisted until an operator accepts it):"
            )?;
            for p in &d.partitions {
                match &p.partition {
                    Some(name) => write!(f, "  partition {name}")?,
                    None => write!(f, "  partition with hash {:016x}", p.hash)?,
                }
                writeln!(f, ": {}", p.reason)?;
            }
            for range in &d.unattributed {
                writeln!(
                    f,
                    "  unattributed damage ({range}): every partition the store does not know is refused"
                )?;
            }
        }
        writeln!(
            f,
            "\nengine: {}",
            self.incarnation
                .as_deref()
                .unwrap_or("no engine has used this store")
        )?;
        writeln!(f, "\npartitions: {}", self.partitions.len())?;
        for p in &self.partitions {
            write!(
                f,
                "  {:<40} {:>8} rows {:>12} bytes",
                p.name, p.rows, p.bytes
            )?;
            match &p.refused {
                Some(why) => writeln!(f, "  REFUSED: {why}")?,
                None => writeln!(f)?,
            }
        }
        writeln!(f, "\nentities: {}", self.entities.len())?;
        for e in &self.entities {
            if let Some(why) = &e.refused {
                writeln!(f, "  {}: REFUSED: {why}", e.entity)?;
                continue;
            }
            let records = e.next_seq - e.first_seq;
            write!(
                f,
                "  {}: records {}..{} ({records} retained)",
                e.entity, e.first_seq, e.next_seq
            )?;
            match e.checkpoint {
                Some(seq) => write!(f, ", checkpoint at {seq}")?,
                None => write!(f, ", no checkpoint")?,
            }
            if e.deferred > 0 {
                write!(f, ", {} deferred", e.deferred)?;
            }
            if e.refused_deferred > 0 {
                write!(f, ", {} refused deferred (set aside)", e.refused_deferred)?;
            }
            if let Some(inc) = e.registered_by {
                write!(f, ", registered by incarnation {inc}")?;
            }
            if let Some(inc) = e.repaired_for {
                write!(f, ", repaired for term {inc}")?;
            }
            if let Some((epoch, expires)) = e.lease {
                write!(f, ", lease epoch {epoch} until {expires} ms")?;
            }
            writeln!(f, ", {} application rows", e.application_rows)?;
        }
        writeln!(f, "\nnamespaces: {}", self.namespaces.len())?;
        for ns in &self.namespaces {
            writeln!(f, "  {}", ns.namespace)?;
            for fence in &ns.fences {
                let what = match fence.kind {
                    FenceKind::Epoch => "epoch",
                    FenceKind::Authority => "authority generation",
                };
                write!(
                    f,
                    "    {what} {}, {} leased shards",
                    fence.current,
                    fence.leased.len()
                )?;
                if let Some(at) = fence.recovered_at_ms {
                    write!(f, ", lease table recovered at {at} ms")?;
                }
                if let Some(r) = &fence.revocation {
                    write!(f, ", revocation {r}")?;
                }
                writeln!(f)?;
                for row in &fence.leased {
                    writeln!(
                        f,
                        "      {}: epoch {}, expires {} ms, acknowledged at {}",
                        row.entity, row.epoch, row.expires_at_ms, row.acked_epoch
                    )?;
                }
            }
            if let Some(why) = &ns.refused {
                writeln!(f, "    REFUSED: {why}")?;
            }
        }
        Ok(())
    }
}

impl Display for Finding {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject, self.problem)
    }
}

impl Display for Verification {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "read {} journal records ({} bytes), {} partitions, {} entity digest chains, {} checkpoints",
            self.records, self.bytes, self.partitions, self.entities, self.checkpoints
        )?;
        if self.findings.is_empty() {
            return writeln!(f, "no damage found");
        }
        writeln!(f, "{} problems found:", self.findings.len())?;
        for finding in &self.findings {
            writeln!(f, "  {finding}")?;
        }
        Ok(())
    }
}
