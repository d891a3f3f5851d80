//! An in-memory [`Iptables`]: the tracer's model of the kernel, one per family, so the fake's state is
//! what the kernel would hold (restores are checked and applied atomically, jumps need their target).
//!
//! ```text
//! FakeIptables (cloneable handle, shared state)
//!   ├─ Iptables impl ─► Tracer::restore / insert_rule / delete_rule / save    (what the agent calls)
//!   └─ test controls ─► fail_next_restore, refuse_lines_containing, flush_chain, remove_jump, remove_chain, dump, restores
//! ```
//!
//! Tests keep one handle and give a clone to the code under test, then compare the modelled kernel
//! state (kube-proxy's state-based fakes) rather than the sequence of calls.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use switchyard_api::IpFamily;

use super::kernel::Iptables;
use super::payload::Table;
use super::tracer::Tracer;
use crate::command::{RestoreInput, context_lines};
use crate::error::Error;

/// Payloads kept for inspection (the most recent ones).
const KEPT_RESTORES: usize = 32;

#[derive(Debug)]
struct State {
    kernels: BTreeMap<IpFamily, Tracer>,
    fail_next: Option<String>,
    fail_family: Option<IpFamily>,
    /// Lines containing this are refused by every restore (a rule the kernel cannot load).
    refuse: Option<String>,
    restores: Vec<(IpFamily, String)>,
    saves: usize,
    rule_commands: usize,
}

/// The fake; clones share one state.
#[derive(Debug, Clone)]
pub struct FakeIptables {
    state: Arc<Mutex<State>>,
}

impl FakeIptables {
    /// A fresh kernel (built-in chains only) for both families; `local_addrs` feed the tracers.
    pub fn new(local_addrs: &[IpAddr]) -> Self {
        let kernels = [IpFamily::IPv4, IpFamily::IPv6]
            .into_iter()
            .map(|f| (f, Tracer::empty(f, local_addrs)))
            .collect();
        Self {
            state: Arc::new(Mutex::new(State {
                kernels,
                fail_next: None,
                fail_family: None,
                refuse: None,
                restores: Vec::new(),
                saves: 0,
                rule_commands: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the next restore (of any family, or only of `family`) fail with `reason` and leave the
    /// kernel as it is, as when the kernel rejects a payload.
    pub fn fail_next_restore(&self, family: Option<IpFamily>, reason: &str) {
        let mut state = self.lock();
        state.fail_next = Some(reason.to_string());
        state.fail_family = family;
    }

    /// Makes every restore fail at the first line containing `pattern` (a rule the kernel cannot
    /// load, e.g. a missing match module), as `iptables-restore` reports it; `None` stops it.
    pub fn refuse_lines_containing(&self, pattern: Option<&str>) {
        self.lock().refuse = pattern.map(str::to_string);
    }

    /// The rules of `chain` (the text after `-A <chain> `), `None` when the chain does not exist.
    pub fn rules(&self, family: IpFamily, table: Table, chain: &str) -> Option<Vec<String>> {
        let state = self.lock();
        let kernel = state.kernels.get(&family)?;
        kernel.has_chain(table, chain).then(|| {
            kernel
                .chain_rules(table, chain)
                .into_iter()
                .map(|(raw, _)| raw)
                .collect()
        })
    }

    /// The chains of `table` in `family`, sorted.
    pub fn chains(&self, family: IpFamily, table: Table) -> Vec<String> {
        self.lock()
            .kernels
            .get(&family)
            .map(|k| k.chain_names(table))
            .unwrap_or_default()
    }

    /// `iptables -F <chain>` behind the agent's back; false when the chain does not exist.
    pub fn flush_chain(&self, family: IpFamily, table: Table, chain: &str) -> bool {
        self.lock()
            .kernels
            .get_mut(&family)
            .is_some_and(|k| k.flush_chain(table, chain))
    }

    /// Removes a chain and every rule jumping to it behind the agent's back.
    pub fn remove_chain(&self, family: IpFamily, table: Table, chain: &str) -> bool {
        self.lock()
            .kernels
            .get_mut(&family)
            .is_some_and(|k| k.remove_chain(table, chain))
    }

    /// Deletes the first rule of built-in `chain` that jumps to `target`, behind the agent's back.
    pub fn remove_jump(&self, family: IpFamily, table: Table, chain: &str, target: &str) -> bool {
        let mut state = self.lock();
        let Some(kernel) = state.kernels.get_mut(&family) else {
            return false;
        };
        let save = kernel.save(table);
        let prefix = format!("-A {chain} ");
        let found = save.lines().find_map(|line| {
            let args = line.strip_prefix(&prefix)?;
            args.ends_with(&format!("-j {target}"))
                .then(|| super::tokens::tokenize(args).ok())
                .flatten()
        });
        found.is_some_and(|args| kernel.delete_rule(table, chain, &args))
    }

    /// Inserts an arbitrary rule (e.g. another component's chain jumping to ours).
    pub fn insert_rule(
        &self,
        family: IpFamily,
        table: Table,
        chain: &str,
        args: &[&str],
    ) -> Result<(), Error> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut state = self.lock();
        match state.kernels.get_mut(&family) {
            Some(kernel) => kernel.insert_rule(table, chain, 0, &args),
            None => Ok(()),
        }
    }

    /// Runs a raw restore payload against the model (e.g. to create foreign chains).
    pub fn restore_text(&self, family: IpFamily, payload: &str) -> Result<(), Error> {
        match self.lock().kernels.get_mut(&family) {
            Some(kernel) => kernel.restore(payload),
            None => Ok(()),
        }
    }

    /// The modelled kernel state of `family` (sorted, `iptables-save`-like, both tables).
    pub fn dump(&self, family: IpFamily) -> String {
        self.lock()
            .kernels
            .get(&family)
            .map(Tracer::dump)
            .unwrap_or_default()
    }

    /// A copy of the modelled kernel of `family` (to trace packets through it).
    pub fn kernel(&self, family: IpFamily) -> Option<Tracer> {
        self.lock().kernels.get(&family).cloned()
    }

    /// The payloads restored successfully, oldest first (the most recent ones).
    pub fn restores(&self) -> Vec<(IpFamily, String)> {
        self.lock().restores.clone()
    }

    /// Number of `iptables-save` calls so far.
    pub fn saves(&self) -> usize {
        self.lock().saves
    }

    /// Number of `-C`/`-I`/`-D`/`-S` commands so far.
    pub fn rule_commands(&self) -> usize {
        self.lock().rule_commands
    }
}

impl Iptables for FakeIptables {
    fn restore(&mut self, family: IpFamily, input: &mut dyn RestoreInput) -> Result<(), Error> {
        let mut buffer = Vec::new();
        input.write_to(&mut buffer).map_err(|source| Error::RunCommand {
            command: "fake iptables-restore".into(),
            source,
        })?;
        let text = String::from_utf8_lossy(&buffer).into_owned();
        let mut state = self.lock();
        let inject = state.fail_next.is_some() && state.fail_family.is_none_or(|f| f == family);
        if inject {
            let reason = state.fail_next.take().unwrap_or_default();
            state.fail_family = None;
            return Err(Error::IptablesRestore {
                binary: "fake-iptables-restore".into(),
                line: Some(1),
                stderr: format!("line 1: {reason}"),
                context: context_lines(&mut text.as_str(), 1),
            });
        }
        if let Some(pattern) = &state.refuse
            && let Some(index) = text.lines().position(|l| l.contains(pattern.as_str()))
        {
            let line = index + 1;
            return Err(Error::IptablesRestore {
                binary: "fake-iptables-restore".into(),
                line: Some(line),
                stderr: format!("line {line}: RULE_APPEND failed (No such file or directory)"),
                context: context_lines(&mut text.as_str(), line),
            });
        }
        let Some(kernel) = state.kernels.get_mut(&family) else {
            return Ok(());
        };
        match kernel.restore(&text) {
            Ok(()) => {
                state.restores.push((family, text));
                if state.restores.len() > KEPT_RESTORES {
                    state.restores.remove(0);
                }
                Ok(())
            }
            Err(Error::ModelRestore { line, reason }) => Err(Error::IptablesRestore {
                binary: "fake-iptables-restore".into(),
                line: Some(line),
                stderr: format!("line {line}: {reason}"),
                context: context_lines(&mut text.as_str(), line),
            }),
            Err(e) => Err(e),
        }
    }

    fn save_lines(
        &mut self,
        family: IpFamily,
        table: Table,
        each: &mut dyn FnMut(&str),
    ) -> Result<(), Error> {
        let text = {
            let mut state = self.lock();
            state.saves += 1;
            state
                .kernels
                .get(&family)
                .map(|k| k.save(table))
                .unwrap_or_default()
        };
        text.lines().for_each(each);
        Ok(())
    }

    fn ensure_rule(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        args: &[String],
    ) -> Result<bool, Error> {
        let mut state = self.lock();
        state.rule_commands += 1;
        let Some(kernel) = state.kernels.get_mut(&family) else {
            return Ok(false);
        };
        if kernel.has_rule(table, chain, args) {
            return Ok(false);
        }
        kernel
            .insert_rule(table, chain, 0, args)
            .map_err(|e| Error::CommandFailed {
                command: format!("fake iptables -t {table} -I {chain} 1 {}", args.join(" ")),
                status: "exit status: 2".into(),
                stderr: e.to_string(),
            })?;
        Ok(true)
    }

    fn delete_rule(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        args: &[String],
    ) -> Result<bool, Error> {
        let mut state = self.lock();
        state.rule_commands += 1;
        Ok(state
            .kernels
            .get_mut(&family)
            .is_some_and(|k| k.delete_rule(table, chain, args)))
    }

    fn chain_exists(&mut self, family: IpFamily, table: Table, chain: &str) -> Result<bool, Error> {
        let mut state = self.lock();
        state.rule_commands += 1;
        Ok(state
            .kernels
            .get(&family)
            .is_some_and(|k| k.has_chain(table, chain)))
    }

    fn list_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
        each: &mut dyn FnMut(&str),
    ) -> Result<bool, Error> {
        let mut state = self.lock();
        state.rule_commands += 1;
        let Some(kernel) = state.kernels.get(&family) else {
            return Ok(false);
        };
        if !kernel.has_chain(table, chain) {
            return Ok(false);
        }
        let prefix = format!("-A {chain} ");
        for line in kernel.save(table).lines().filter(|l| l.starts_with(&prefix)) {
            each(line);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptables::{jump_rules, names};

    const PAYLOAD: &str = "*nat\n:SWYD-SERVICES - [0:0]\n:SWYD-POSTROUTING - [0:0]\n:SWYD-X - [0:0]\n\
                           -A SWYD-SERVICES -j SWYD-X\n-A SWYD-X -j RETURN\nCOMMIT\n";

    #[test]
    fn restores_apply_atomically_and_failures_leave_the_state() {
        let mut fake = FakeIptables::new(&[]);
        fake.restore(IpFamily::IPv4, &mut PAYLOAD.to_string()).unwrap();
        assert!(fake.dump(IpFamily::IPv4).contains("-A SWYD-X -j RETURN"));
        assert!(!fake.dump(IpFamily::IPv6).contains("SWYD-X"));
        let before = fake.dump(IpFamily::IPv4);
        let err = fake
            .restore(
                IpFamily::IPv4,
                &mut "*nat\n:SWYD-Y - [0:0]\n-A SWYD-Y -j SWYD-NOPE\nCOMMIT\n",
            )
            .unwrap_err();
        let Error::IptablesRestore { line, context, .. } = &err else {
            panic!("{err}")
        };
        assert_eq!(*line, Some(4));
        assert!(context.contains(">     4 COMMIT"), "{context}");
        assert_eq!(fake.dump(IpFamily::IPv4), before);

        fake.fail_next_restore(Some(IpFamily::IPv6), "injected");
        fake.restore(IpFamily::IPv4, &mut PAYLOAD.to_string()).unwrap();
        assert!(fake.restore(IpFamily::IPv6, &mut PAYLOAD.to_string()).is_err());
        fake.restore(IpFamily::IPv6, &mut PAYLOAD.to_string()).unwrap();
        assert_eq!(fake.restores().len(), 3);
    }

    #[test]
    fn jump_rules_are_ensured_once_and_need_their_target() {
        let mut fake = FakeIptables::new(&[]);
        let jump = jump_rules(IpFamily::IPv4)
            .into_iter()
            .find(|j| j.table == Table::Nat && j.chain == "OUTPUT")
            .unwrap();
        assert!(
            fake.ensure_jump(&jump).is_err(),
            "the target chain does not exist yet"
        );
        fake.restore(IpFamily::IPv4, &mut PAYLOAD.to_string()).unwrap();
        assert!(fake.ensure_jump(&jump).unwrap());
        assert!(!fake.ensure_jump(&jump).unwrap());
        assert!(fake.remove_jump(IpFamily::IPv4, Table::Nat, "OUTPUT", names::SERVICES));
        assert!(!fake.delete_jump(&jump).unwrap());
        assert!(fake.ensure_jump(&jump).unwrap());
        assert!(fake.delete_jump(&jump).unwrap());
    }

    #[test]
    fn drift_can_be_simulated_and_seen_in_save() {
        let mut fake = FakeIptables::new(&[]);
        fake.restore(IpFamily::IPv4, &mut PAYLOAD.to_string()).unwrap();
        assert!(fake.flush_chain(IpFamily::IPv4, Table::Nat, "SWYD-X"));
        let save = fake.save(IpFamily::IPv4, Table::Nat).unwrap();
        assert!(
            save.contains(":SWYD-X - [0:0]") && !save.contains("-A SWYD-X"),
            "{save}"
        );
        assert!(save.contains(":PREROUTING ACCEPT [0:0]"));
        assert!(fake.remove_chain(IpFamily::IPv4, Table::Nat, "SWYD-X"));
        assert!(!fake.chain_exists(IpFamily::IPv4, Table::Nat, "SWYD-X").unwrap());
        assert!(
            !fake
                .save(IpFamily::IPv4, Table::Nat)
                .unwrap()
                .contains("-j SWYD-X")
        );
        assert_eq!(fake.saves(), 2);
    }
}
