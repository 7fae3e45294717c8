#!/bin/sh
# Read-only probe of the NVIDIA driver stack. Prints "=== <name> rc=<N>" and then the command's output, for each
# command; vllm_fleet.driver parses it on the controller. Changes nothing; needs no network.
section() {
  name=$1; shift
  if ! command -v "$1" >/dev/null 2>&1; then
    # the shell's own message would carry this script's temporary path and change every run
    printf '=== %s rc=127\n%s: command not found\n' "$name" "$1"
    return
  fi
  out=$("$@" 2>&1); rc=$?
  printf '=== %s rc=%s\n%s\n' "$name" "$rc" "$out"
}
section kernel uname -r
section os_release cat /etc/os-release
section pci sh -c 'for d in /sys/bus/pci/devices/*; do [ -e "$d/vendor" ] && printf "%s %s %s\n" "${d##*/}" "$(cat "$d/vendor")" "$(cat "$d/class")"; done'
section nvidia_smi_query nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,persistence_mode,compute_cap --format=csv,noheader
section nvidia_smi_version nvidia-smi --version
section proc_driver_version cat /proc/driver/nvidia/version
section module_version cat /sys/module/nvidia/version
section proc_modules sh -c "grep -E '^(nvidia|nvidia_uvm|nvidia_drm|nvidia_modeset|nouveau) ' /proc/modules || true"
section dpkg sh -c "dpkg-query -W -f='\${binary:Package}\t\${Version}\t\${db:Status-Abbrev}\n' | grep -E '^(nvidia|libnvidia|cuda|libcuda|firmware-nvidia|xserver-xorg-video-nvidia|libxnvctrl|linux-headers|linux-image|dkms)' || true"
section modinfo_version modinfo -F version nvidia
section headers sh -c 'test -d "/lib/modules/$(uname -r)/build" && echo present'
section secure_boot mokutil --sb-state
# the EFI variable itself, for hosts without mokutil: 4 attribute bytes, then 1 = Secure Boot on
section efi_secure_boot od -An -t u1 /sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c
section mok_dkms_key mokutil --test-key /var/lib/dkms/mok.pub
section dkms_status dkms status
# a container runs the kernel of the machine under it: no module can be built or loaded from inside
section virt systemd-detect-virt --container
section nouveau_blacklist sh -c 'grep -ls "^blacklist nouveau" /etc/modprobe.d/*.conf /lib/modprobe.d/*.conf /usr/lib/modprobe.d/*.conf 2>/dev/null'
section persistenced systemctl is-enabled nvidia-persistenced
echo "=== end rc=0"
