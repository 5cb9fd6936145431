// A model of the memory reset (BENCHMARKS.md round 29): a 9 MiB private mapping of a memfd
// image, 600 pages read and WR pages written per run, then the dirty pages found with
// PAGEMAP_SCAN and copied back, either as the host does it (written pages with a page
// table entry that are not file-backed) or with userfaultfd write-protection (async).
// Build and run (Linux 6.7+, as root or with vm.unprivileged_userfaultfd=1 for the second):
//   gcc -O2 -DWR=30 -o /tmp/uffd-reset bench/micro/uffd_reset.c && /tmp/uffd-reset && /tmp/uffd-reset uffd
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <unistd.h>
#include <fcntl.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <linux/userfaultfd.h>
#include <linux/fs.h>

#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_HUGETLBFS_SHMEM (1<<12)
#define UFFD_FEATURE_WP_UNPOPULATED (1<<13)
#define UFFD_FEATURE_WP_ASYNC (1<<15)
#endif
struct page_region { uint64_t start, end, categories; };
struct pm_scan_arg { uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted, category_mask, category_anyof_mask, return_mask; };
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#define PM_SCAN_WP_MATCHING (1<<0)
#define PM_SCAN_CHECK_WPASYNC (1<<1)
#define PAGE_IS_WPALLOWED (1<<0)
#define PAGE_IS_WRITTEN (1<<1)
#define PAGE_IS_FILE (1<<2)
#define PAGE_IS_PRESENT (1<<3)
#define PAGE_IS_SWAPPED (1<<4)
#define PAGE_IS_PFNZERO (1<<5)

static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
#define PG 4096
int main(int argc,char**argv){
  size_t len = 9*1024*1024; int npages=len/PG;
  int mfd = memfd_create("img", MFD_CLOEXEC);
  ftruncate(mfd,len);
  char*img = mmap(0,len,PROT_READ|PROT_WRITE,MAP_SHARED,mfd,0);
  for(size_t i=0;i<len;i+=64) img[i]=(char)i;
  char*m = mmap(0,len,PROT_READ|PROT_WRITE,MAP_PRIVATE,mfd,0);
  int pm = open("/proc/self/pagemap",O_RDONLY);
  int use_uffd = argc>1;
  int uffd=-1;
  if(use_uffd){
    uffd = syscall(SYS_userfaultfd, O_CLOEXEC|O_NONBLOCK|UFFD_USER_MODE_ONLY);
    if(uffd<0){perror("userfaultfd");return 1;}
    struct uffdio_api api={.api=UFFD_API,.features=UFFD_FEATURE_WP_ASYNC|UFFD_FEATURE_WP_UNPOPULATED|UFFD_FEATURE_WP_HUGETLBFS_SHMEM};
    if(ioctl(uffd,UFFDIO_API,&api)){perror("api");return 1;}
    struct uffdio_register reg={.range={(uint64_t)m,len},.mode=UFFDIO_REGISTER_MODE_WP};
    if(ioctl(uffd,UFFDIO_REGISTER,&reg)){perror("register");return 1;}
    struct uffdio_writeprotect wp={.range={(uint64_t)m,len},.mode=UFFDIO_WRITEPROTECT_MODE_WP};
    if(ioctl(uffd,UFFDIO_WRITEPROTECT,&wp)){perror("wp");return 1;}
  }
  // a "run": read 600 scattered pages, write 30
  struct page_region regs[64];
  double tot=0, all0=now(); int iters=20000; long reset_pages=0;
  volatile char sink=0;
  for(int it=0;it<iters;it++){
    for(int i=0;i<600;i++) sink+=m[((i*37)%npages)*PG];
    for(int i=0;i<WR;i++) m[((i*101+it%3)%npages)*PG+8]=1;
    if(it==0 || it==1){ /* first anon pages from earlier writes persist */ }
    double t0=now();
    struct pm_scan_arg a; memset(&a,0,sizeof a);
    a.size=sizeof a; a.start=(uint64_t)m; a.end=(uint64_t)m+len; a.vec=(uint64_t)regs; a.vec_len=64;
    a.max_pages=256;
    if(use_uffd){
      a.flags=PM_SCAN_CHECK_WPASYNC;
      a.category_mask=PAGE_IS_WRITTEN;
      a.return_mask=PAGE_IS_WRITTEN;
    } else {
      a.category_inverted=PAGE_IS_PFNZERO|PAGE_IS_FILE;
      a.category_mask=PAGE_IS_WRITTEN|PAGE_IS_PFNZERO|PAGE_IS_FILE;
      a.category_anyof_mask=PAGE_IS_PRESENT|PAGE_IS_SWAPPED;
    }
    long n=ioctl(pm,PAGEMAP_SCAN,&a);
    if(n<0){perror("scan");return 1;}
    for(long r=0;r<n;r++){ memcpy((void*)regs[r].start, img+(regs[r].start-(uint64_t)m), regs[r].end-regs[r].start); reset_pages+=(regs[r].end-regs[r].start)/PG; if(use_uffd){struct uffdio_writeprotect wp={.range={regs[r].start,regs[r].end-regs[r].start},.mode=UFFDIO_WRITEPROTECT_MODE_WP}; if(ioctl(uffd,UFFDIO_WRITEPROTECT,&wp)){perror("wp2");return 1;}}}
    tot+=now()-t0;
  }
  printf("total %.2f us per run; ", (now()-all0)/iters); printf("%s: %.2f us per reset, %.1f pages reset per run\n", use_uffd?"uffd-wp":"present", tot/iters, (double)reset_pages/iters);
  return 0;
}
