package agent

import (
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ext4ResizeFS is EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64): grow a
// mounted ext4 file system to a number of blocks.
const ext4ResizeFS = 0x40086610

// growRoot grows the root file system (mounted at root) to fill its
// disk: the runtime makes each sandbox's disk the size it asked for, on
// a template image that holds little more than the template's files.
// A file system that fills its disk already is left alone, as is one
// larger than its disk (ext4 cannot shrink while mounted).
func growRoot(root string) error {
	dev, err := os.Open(RootDevice)
	if err != nil {
		return err
	}
	defer dev.Close()
	size, err := unix.IoctlGetUint64(int(dev.Fd()), unix.BLKGETSIZE64)
	if err != nil {
		return fmt.Errorf("size of %s: %w", RootDevice, err)
	}
	var sb [1024]byte
	if _, err := dev.ReadAt(sb[:], 1024); err != nil {
		return fmt.Errorf("superblock of %s: %w", RootDevice, err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[56:]) != unix.EXT4_SUPER_MAGIC {
		return nil
	}
	blockSize := uint64(1024) << le.Uint32(sb[24:])
	have := uint64(le.Uint32(sb[4:]))
	if le.Uint32(sb[96:])&0x80 != 0 { // INCOMPAT_64BIT
		have |= uint64(le.Uint32(sb[0x150:])) << 32
	}
	want := size / blockSize
	if want <= have {
		return nil
	}
	d, err := os.Open(root)
	if err != nil {
		return err
	}
	defer d.Close()
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, d.Fd(), ext4ResizeFS, uintptr(unsafe.Pointer(&want))); errno != 0 {
		return fmt.Errorf("grow the root file system from %d to %d blocks: %w", have, want, errno)
	}
	return nil
}
