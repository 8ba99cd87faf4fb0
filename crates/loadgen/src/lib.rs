//! What the load generator shares with the memory tests (`tests/memory`):
//! reading a process's CPU time and memory from `/proc`.

pub mod process;
