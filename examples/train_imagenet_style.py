"""ImageNet training in the shape of PyTorch's reference script (pytorch/examples imagenet/main.py),
ported to an ensemble on one shared input pipeline: each member trains its own
``torchvision.models`` architecture on the same stream, with the user's own torchvision transforms.

Run one process per member, under either launcher, with no code change::

    mpiexec -n 2 python examples/train_imagenet_style.py DIR -a resnet18,mobilenet_v3_small
    torchrun --standalone --nproc-per-node 2 examples/train_imagenet_style.py DIR -a resnet18,mobilenet_v3_small

``DIR`` holds ``train/`` and ``val/``, one folder per class, as ``torchvision.datasets.ImageFolder``
reads them (or enspipe's TFRecord shards). Member k trains ``-a``'s k-th architecture (in turn
where there are fewer). What changed from the reference script, and nothing else:

* the training ``ImageFolder``, ``DistributedSampler`` and ``DataLoader`` are one
  ``enspipe.SharedStream(traindir, batch_size, preprocess=train_transforms)``: the members share
  the decoding and augmentation, and one pass over ``stream.torch()`` is one epoch of every sample
  once, the last batch short, as the ``DataLoader``'s;
* validation is ``enspipe.validation_set(valdir, preprocess=val_transforms)``, held in memory;
* each member writes its own checkpoints (``OUT/<arch>/checkpoint.pth.tar``, ``model_best``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time

import torch
import torch.nn as nn
import torchvision.models as models
import torchvision.transforms as transforms

import enspipe

model_names = sorted(name for name in models.__dict__ if name.islower() and not name.startswith("__")
                     and callable(models.__dict__[name]))

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training, an ensemble on one shared stream")
parser.add_argument("data", metavar="DIR", help="path to dataset (train/ and val/)")
parser.add_argument("-a", "--arch", metavar="ARCH", default="resnet18",
                    help="model architectures, one per member, comma-separated (" + " | ".join(model_names[:8]) +
                    " | ...; default: resnet18)")
parser.add_argument("-j", "--workers", default=None, type=int, metavar="N",
                    help="preprocessing workers per member (default: its share of the node's cores)")
parser.add_argument("--epochs", default=90, type=int, metavar="N", help="number of total epochs to run")
parser.add_argument("--start-epoch", default=0, type=int, metavar="N", help="manual epoch number (useful on restarts)")
parser.add_argument("-b", "--batch-size", default=256, type=int, metavar="N", help="mini-batch size (default: 256)")
parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, metavar="LR", help="initial learning rate",
                    dest="lr")
parser.add_argument("--momentum", default=0.9, type=float, metavar="M", help="momentum")
parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, metavar="W", help="weight decay (default: 1e-4)",
                    dest="weight_decay")
parser.add_argument("-p", "--print-freq", default=10, type=int, metavar="N", help="print frequency (default: 10)")
parser.add_argument("--resume", action="store_true", help="resume each member from its latest checkpoint")
parser.add_argument("--seed", default=0, type=int, help="seed for initializing training")
parser.add_argument("--image-size", default=224, type=int, help="crop size (the reference's 224)")
parser.add_argument("--out", default=".", help="where each member writes OUT/<arch>/ (checkpoints, result.json)")
best_acc1 = 0


def main():
    global best_acc1
    args = parser.parse_args()
    traindir, valdir = os.path.join(args.data, "train"), os.path.join(args.data, "val")
    size = args.image_size
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_transforms = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                           transforms.ToTensor(), normalize])
    val_transforms = transforms.Compose([transforms.Resize(size * 256 // 224), transforms.CenterCrop(size),
                                         transforms.ToTensor(), normalize])

    stream = enspipe.SharedStream(traindir, args.batch_size, preprocess=train_transforms, seed=args.seed,
                                  threads=args.workers)
    torch.manual_seed(args.seed + stream.member)
    archs = args.arch.split(",")
    arch = archs[stream.member % len(archs)]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"=> member {stream.member}: creating model '{arch}'", flush=True)
    model = models.__dict__[arch](num_classes=stream.num_classes).to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    out = os.path.join(args.out, arch)
    os.makedirs(out, exist_ok=True)
    if args.resume and os.path.isfile(os.path.join(out, "checkpoint.pth.tar")):
        checkpoint = torch.load(os.path.join(out, "checkpoint.pth.tar"), map_location=device)
        args.start_epoch, best_acc1 = checkpoint["epoch"], checkpoint["best_acc1"]
        model.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        print(f"=> member {stream.member}: resumed at epoch {args.start_epoch}", flush=True)
    val_images, val_labels = enspipe.validation_set(valdir, preprocess=val_transforms)
    val_set = torch.utils.data.TensorDataset(torch.from_numpy(val_images), torch.from_numpy(val_labels).long())
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=args.batch_size)

    history = []
    for epoch in range(args.start_epoch, args.epochs):
        train(stream, model, criterion, optimizer, epoch, device, args)
        acc1, acc5 = validate(val_loader, model, criterion, device, args)
        scheduler.step()
        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        save_checkpoint({"epoch": epoch + 1, "arch": arch, "state_dict": model.state_dict(), "best_acc1": best_acc1,
                         "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, is_best, out)
        history.append({"epoch": epoch, "acc1": acc1, "acc5": acc5})
    stream.close()  # serves the other members' batches until every member is done
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"member": stream.member, "arch": arch, "history": history, "stream_epochs": stream.epochs(),
                   "num_images": stream.num_images}, f, indent=1)


def train(stream, model, criterion, optimizer, epoch, device, args):
    batch_time, data_time = AverageMeter("Time", ":6.3f"), AverageMeter("Data", ":6.3f")
    losses, top1, top5 = AverageMeter("Loss", ":.4e"), AverageMeter("Acc@1", ":6.2f"), AverageMeter("Acc@5", ":6.2f")
    batches = stream.torch(layout="channels_last", device=device)
    progress = ProgressMeter(len(batches), [batch_time, data_time, losses, top1, top5],
                             prefix=f"member {stream.member} Epoch: [{epoch}]")
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(batches):
        data_time.update(time.time() - end)
        output = model(images)
        loss = criterion(output, target)
        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        losses.update(loss.item(), images.size(0))
        top1.update(acc1[0], images.size(0))
        top5.update(acc5[0], images.size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batch_time.update(time.time() - end)
        end = time.time()
        if i % args.print_freq == 0:
            progress.display(i + 1)


def validate(val_loader, model, criterion, device, args):
    batch_time, losses = AverageMeter("Time", ":6.3f"), AverageMeter("Loss", ":.4e")
    top1, top5 = AverageMeter("Acc@1", ":6.2f"), AverageMeter("Acc@5", ":6.2f")
    progress = ProgressMeter(len(val_loader), [batch_time, losses, top1, top5], prefix="Test: ")
    model.eval()
    with torch.no_grad():
        end = time.time()
        for i, (images, target) in enumerate(val_loader):
            images, target = images.to(device), target.to(device)
            output = model(images)
            loss = criterion(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            losses.update(loss.item(), images.size(0))
            top1.update(acc1[0], images.size(0))
            top5.update(acc5[0], images.size(0))
            batch_time.update(time.time() - end)
            end = time.time()
            if i % args.print_freq == 0:
                progress.display(i + 1)
    print(f" * Acc@1 {top1.avg:.3f} Acc@5 {top5.avg:.3f}", flush=True)
    return float(top1.avg), float(top5.avg)


def save_checkpoint(state, is_best, out):
    path = os.path.join(out, "checkpoint.pth.tar")
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)  # a member killed while saving leaves its last checkpoint whole
    if is_best:
        shutil.copyfile(path, os.path.join(out, "model_best.pth.tar"))


class AverageMeter:
    """Computes and stores the average and current value"""

    def __init__(self, name, fmt=":f"):
        self.name, self.fmt = name, fmt
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = float(val)
        self.sum += float(val) * n
        self.count += n
        self.avg = self.sum / self.count

    def __str__(self):
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(**self.__dict__)


class ProgressMeter:
    def __init__(self, num_batches, meters, prefix=""):
        digits = len(str(num_batches))
        self.batch_fmtstr = "[{:" + str(digits) + "d}/" + str(num_batches) + "]"
        self.meters, self.prefix = meters, prefix

    def display(self, batch):
        print("\t".join([self.prefix + self.batch_fmtstr.format(batch)] + [str(m) for m in self.meters]), flush=True)


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k"""
    with torch.no_grad():
        maxk = min(max(topk), output.size(1))
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:min(k, maxk)].reshape(-1).float().sum(0, keepdim=True).mul_(100.0 / target.size(0))
                for k in topk]


if __name__ == "__main__":
    main()
