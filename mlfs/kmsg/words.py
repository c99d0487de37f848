"""The words of the kernel's own messages: what may ship beyond the host as it is.

Generated once from syzkaller's Linux crash-report corpus (tests/data/syzkaller/, Apache
License 2.0): every word of letters that appears in at least 8 of its 747 logs (so a
command or host name of one log is not among them), lower-cased, without the two- to
four-letter words of hex digits (addresses); and the words of the formats
`mlfs.kmsg.kinds` reads (block, file system, SCSI, libata, NVMe, OOM, USB, audit).
`mlfs.kmsg.masking.private_masked` keeps a word of a message only if it is here, looks
like a kernel symbol, a kernel source path or a block device; anything else is replaced
by a typed placeholder.
Adding a word here is a privacy decision: a word that names a person, a host or a
program of one user must never be added.
"""

WORDS = frozenset("""
ext4-fs ext3-fs ext2-fs f2fs-fs btrfs xfs jbd2 ipvs ipv4 ipv6 cifs vfs smb nfs bluetooth tcp udp
icmp preempt voluntary dynamic prio class fsuid ouid gid ses sig syscall addrconf hwaddr
renamed becomes dropping packet destination wlan usb pci ata scsi nvme
abort aborting access acquire active activity addr address after age all allocated
allocation already an and anon-rss apparmor arch are around as associated assuming async
at atomic attached attempt attributes audit auid authenticate available avc backtrace
bad-access because behavior behaviour behind belongs binder bitmap block blocked bochs
booting bssid btrfs buffer bug buggy but by bytes cache call callbacks called caller can
caused cdb cgroup chain checksum circular cmd code comm command compute conflict
connected constraint context control controller core correctness corrupted corruption
could count cpu cpus cpuset create created critical ctx current cut daif data deadlock
debug debugging debugobjects deleted denied dependency depends deprecated deref
dereference descriptor detected dev device devices directory disabled disables disabling
disconnected disk divide domain done double down drive driverbyte drivers due dummy-virt
dump dumped dumping duration echo emask empty enabled end engine entry error errors
event events evict exceeded exception executing existing exists expected express ext
failed failslab failure fatal fault features ffffffff ffffffffffffffda ffffffffffffffff
file file-rss filesystem first flags flush for forcing found fp fput fqs frame free
freed from frozen fs fs-error fsnotify ftrace full full-speed function general generic
gets getsockopt getty google grace-period handle handler hang hard hardirqs hardware has
head held help here hex high-speed hint holding hostbyte hung id idle idling illegal in
include inconsistent index inet info init inline ino inode inside int interface internal
interrupt interval invalid invoked ioctl ip iput irq is jiffies journal kasan kernel key
kfence kfree khungtaskd killed kmalloc kobject ksoftirqd kthread kvfree kworker last
lastcpupid ldata leak left level lib likely limit line link linked linux list local
located lock lockdep locking locks lockup logical login long lookup loop lost lr machine
manufacturer map mapcount mapping mask media medium mem memcpy memory memset message
messages metadata mfr might migratetype missing mm mmap mmput mode modules more mount
mounted mutex name net netlink netns new nexus nil no node nodemask non-canonical
nonblocking none normal not not-present now null null-ptr-deref number nvme object of
off offline offset ok on oom-kill oom-killer oops op opcode operation option or order
other out overflow page pages paging panic parsing path pc pfn pgd pgtables physical pid
pipe pointer port possible ppid preemptible printk probability probably proc process
product profile program protection protocol psr pstate putname qid qsmask quota range
raw rcu read read-only reading readonly reason rebooting refcount referenced region
register registered release remounting report request res reservation reset resetting
resource responding result retry returned reverse rlock root rsyslogd run running
scenario sched schedule scheduler scsi sctp sda sdb secondary seconds sector seen
segfault segment self-detected sending sense serialnumber serror server ses set
setsockopt shmem-rss showing shutting size skipped slab slab-out-of-bounds sleeping
socket soft softirq softirqs softlockup sp space ssid stack stack-overflow stall stalls
stamp standard start starved state status still stopping stored string strings stuck
sufficient super-speed supervisor suppressed suspicious swapper switch sync syncing sys
syscall system syz syz-executor syz-fuzzer syzkaller table tag taint tainted takes
target task tasks tgid than that the there this ticks time timeout times to too took
total-vm trace tracks translation transport trap traps trying ts tty turned turning type
udevd uid unable unaligned undefined undefined-behaviour uninit uninit-value
uninitialized unknown unless unmounted unmovable unrecovered unreferenced unsafe up us
usage usb use use-after-free used user usercopy using validator value vda via virtual
vmalloc vscnprintf vsnprintf warning was watchdog which while with without wlan work
workqueue write writeback writing xfs zone zones
""".split())
